"""Process exit codes every scheduler adapter agrees on.

A fill job that stopped early because it was asked to (SIGTERM, SIGUSR1, SIGINT) exits with
:data:`PREEMPTED_REQUEUE` after checkpointing. Slurm is configured with
``RequeueExit=99`` so the job is requeued instead of being recorded COMPLETED (a preempted job
exiting 0 loses its remaining work); the Kubernetes Job's podFailurePolicy ignores the same code
so a preemption never counts against the backoff limit.
"""

OK = 0
#: Bad input the user can fix (CLI convention: one readable line on stderr): a usage error, an
#: empty or malformed manifest, an unreadable checkpoint, an output directory another job owns,
#: a full disk. A fill job exiting with it under Slurm is FAILED; the fill agent resubmits it
#: within its retry budget.
USAGE = 2
#: Stopped on request after a checkpoint: requeue me. Matches ``RequeueExit=99`` in slurm.conf.
PREEMPTED_REQUEUE = 99
