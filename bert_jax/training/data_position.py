"""Where a run's input pipeline stands, as saved with a checkpoint and read back on resume.

Hosts read different files, so each process has its own position; a checkpoint's `data` item
holds all of them, and a resumed run with the same number of hosts gives each process its own
back, so that it reads exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from absl import logging


def gather_positions(position: dict[str, int], records: str | None = None) -> dict[str, Any]:
  """Every process's data position, for the checkpoint (hosts read different files, so their
  positions can differ): `[epoch, batch]`, or `[epoch, batch, row]` for a stream that packs
  rows as it reads (`row`: where in that batch of records the next row lies); with `records`,
  the identity of the records the positions are in (`records_summary.records_identity`)."""
  local = np.asarray([position.get("epoch", 0), position.get("batch", 0),
                      position.get("row", 0)], np.int64)
  if jax.process_count() == 1:
    gathered = local[None]
  else:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    gathered = np.asarray(multihost_utils.process_allgather(local)).reshape(-1, 3)
  if not gathered[:, 2].any():  # the layout checkpoints of unpacked streams have always had
    gathered = gathered[:, :2]
  return {"per_process": gathered.tolist(), **({"records": records} if records else {})}


def own_position(data_state: dict[str, Any], records: str | None = None
                 ) -> dict[str, int] | None:
  """This process's position from a checkpoint's `data` item; None (the records' first epoch)
  when the records it was saved in are not the ones given now (`records`: their identity),
  said in a warning: a position means nothing in records rewritten under the same names."""
  saved = data_state.get("records")
  if records and saved and saved != records:
    logging.warning("The records changed since this checkpoint was saved (their files, sizes "
                    "or summary.json differ): its data position is not a place in them, so "
                    "training goes on from their first epoch. Restore the records it was "
                    "trained on to continue exactly where it stopped.")
    return None
  per_process = data_state.get("per_process") or []
  if len(per_process) != jax.process_count():
    raise ValueError(f"The checkpoint's data position is for {len(per_process)} processes; this "
                     f"run has {jax.process_count()}. Resume with the same number of hosts.")
  epoch, batch, *row = per_process[jax.process_index()]
  return {"epoch": int(epoch), "batch": int(batch), **({"row": int(row[0])} if row else {})}
