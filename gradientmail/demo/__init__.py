"""The main job: a local Decoupled DiLoCo run of a tiny GPT on Shakespeare (``python -m gradientmail.demo``).

``data`` (the text as bytes), ``model``/``model_mlx`` (twin GPTs), ``trainer`` (the loop),
``worker`` (one learner in a ``gm.Session``), ``baseline`` (one learner, no exchange),
``launcher``/``rounds``/``display`` (processes, the mailbox's round records, the screen).
Nothing here is imported by ``import gradientmail``: PyTorch and MLX stay optional.
"""
