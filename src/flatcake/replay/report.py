"""``python -m flatcake.replay.report``: the report's former entry point, kept for the
commands already written down; the report is ``python -m flatcake.report`` (its own
package, above the replay: this module only runs it by name, it imports nothing)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("flatcake.report", run_name="__main__", alter_sys=True)
