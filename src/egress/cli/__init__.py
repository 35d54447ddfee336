"""The command line interface (typer + rich).

Imported before anything else of the CLI, so that the garbage collector runs with a run's
thresholds from the first import (:func:`egress.runtime.garbage_collection.tune_for_run`): the
~48,000 objects that the imports create live until the process exits, and young collections every
700 of them found nothing to free (14 M of a 300-message run's 1,160 M instructions)."""

from egress.runtime.garbage_collection import tune_for_run

tune_for_run()
