"""The main job: a local Decoupled DiLoCo run of a tiny GPT on Shakespeare (``python -m demo``).

``data`` (the text as bytes), ``model``/``model_mlx`` (twin GPTs, also the examples' model),
``trainer`` (the loop), ``device`` (``GRADIENTMAIL_DEVICE`` as a torch device), ``worker``
(one learner in a ``gm.Session``; also ``gradientmail node``'s default job), ``baseline``
(one learner, no exchange), ``launcher``/``rounds``/``display`` (processes, the mailbox's
round records, the screen).

It lives beside the library, not in it: the wheel ships ``gradientmail`` only, so PyTorch,
MLX and Shakespeare stay out of the library. Run it from the repository root (``./scripts/train``);
the container images copy this folder and put it on ``PYTHONPATH``.
"""
