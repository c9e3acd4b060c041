"""The PASS/FAIL lines of a benchmark's checks on a device: printed as they come (a run cut short
still shows what it checked), counted, and written as a markdown section at the end."""

from __future__ import annotations


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

  def write(self, path: str | None, header: str) -> None:
    if path:
      with open(path, "w", encoding="utf-8") as f:
        f.write(header + "\n".join(self.lines) + "\n")
