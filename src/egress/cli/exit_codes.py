"""The exit codes of the ``egress`` commands, with what each means (``egress --help`` lists them)."""

EXIT_CODES = {
    0: "done: drained, or stopped by Ctrl-C after the final commit",
    1: "a failure: a sink blocked by a terminal error, a run error, an address or directory that cannot be used, "
       "an instance that does not answer (status)",
    2: "a usage or Spec problem: bad option, invalid Spec, or a Spec that does not fit the committed state",
    130: "interrupted before every message was delivered (--until-drained), or a second Ctrl-C",
}

INTERRUPTED = 130
"""The exit code of an interrupted command (:data:`EXIT_CODES`)."""
