"""The PASS/FAIL lines of a benchmark's checks on a device: printed as they come (a run cut short
still shows what it checked), counted, and written as a markdown section at the end; and the one
way those checks time what they compare."""

from __future__ import annotations

import statistics
import time


def timed_ms(fn, args: tuple, steps: int, repeats: int) -> float:
  """Median milliseconds per call of `fn(*args)` over `repeats` runs of `steps` calls, after
  one call that compiles (each run waits for its last output)."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(steps):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / steps * 1e3)
  return statistics.median(times)


class Checklist:
  """`check` records a PASS or FAIL line, `note` a plain one; `failures` counts the FAILs (the
  scripts' exit status); `write` puts a header and the lines in a markdown file."""

  def __init__(self):
    self.lines: list[str] = []
    self.failures = 0

  def note(self, text: str) -> None:
    self.lines.append(text)
    print(text, flush=True)

  def check(self, ok: bool, text: str) -> None:
    self.failures += not ok
    self.note(f"- {'PASS' if ok else 'FAIL'}: {text}")

  def write(self, path: str | None, title: str, command: str) -> None:
    """The section `## <title> on <device> (jax <version>)`, its command line, then the lines
    (nothing without a `path`)."""
    if not path:
      return
    import jax  # pylint: disable=g-import-not-at-top
    header = (f"## {title} on {jax.devices()[0].device_kind} (jax {jax.__version__})\n\n"
              f"- Command: {command}\n")
    with open(path, "w", encoding="utf-8") as f:
      f.write(header + "\n".join(self.lines) + "\n")
