"""The harness the tests and the benchmarks share: real parts for runs that must be real.

``processes`` starts learner processes side by side (a hang fails with every process's stacks),
``seaweed`` a loopback SeaweedFS S3 server, ``fault_proxy`` and ``delay_proxy`` an S3 proxy
that injects faults or delay in front of it, and ``mailbox_run`` an in-process run (a memory or
directory mailbox, an in-process syncer on a manual clock) that a test or a benchmark drives
pass by pass. Nothing here is part of the library.
"""
