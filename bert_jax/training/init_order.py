"""The initialisation order of every run (pre-training and fine-tuning alike): `initial_state`.

1. this run's own `checkpoints/` hold a step: resume it (state, RNG and data position);
2. else `init_checkpoint`: with `init_mode="continue"` another run's whole state (an Orbax
   checkpoint: optimizer, step and schedule go on, only the data changes); with
   `init_mode="params"` the weights of any kind, for the scopes the objective takes
   (`Objective.init_scopes`: pre-training takes encoder and heads, fine-tuning the encoder),
   merged over a fresh initialisation (absent heads start fresh; a longer position table keeps
   the trained rows);
3. else a fresh initialisation from the seed.

A run that starts (2 with `init_mode="params"`, or 3) then passes its parameters through the
objective's `initialize_params` (`training/objective.py`: a distillation teacher's weights).
Checkpoints of every kind are read through interop's format readers (`interop/checkpoints.py`),
so interop never needs the training package.
"""

from __future__ import annotations

import dataclasses

import jax

from bert_jax.interop.checkpoints import (KIND_NAMES, checkpoint_kind, extend_positions,
                                          in_layout, load_any, merge_params, orbax_directory,
                                          select_scopes, unused_note)
from bert_jax.training import checkpointing, data_position
from bert_jax.training import state as state_lib
from bert_jax.training.objective import Objective


@dataclasses.dataclass
class InitialState:
  """A run's starting train state, its shardings, and where it came from."""
  state: state_lib.TrainState
  shardings: state_lib.TrainState
  position: dict[str, int] | None   # the data position to resume from (own checkpoint only)
  origin: str                       # where the state came from, for the run's first line
  # What the run's own checkpoint recorded beside the state (resumed runs only): e.g. its model
  # selection (`training/selection.py`).
  metadata: dict | None = None


def initial_state(objective, model, tx, mesh, rules, *, batch_size: int, seed: int,
                  checkpoints: checkpointing.CheckpointManager | None,
                  init_checkpoint: str | None = None, init_mode: str = "params",
                  bert_config_file: str | None = None,
                  records: str | None = None) -> InitialState:
  """The train state of a run, by the init order of the module docstring; `records`: the
  identity of the records the run reads, against which a resumed position is checked."""
  example = objective.example_batch(batch_size)
  abstract, state_sh = state_lib.abstract_train_state(model, tx, mesh, rules, example,
                                                      objective.input_names)
  if checkpoints is not None and checkpoints.latest_step() is not None:
    # The newest step that is intact; newer damaged ones are set aside (named in a warning),
    # so that this run saves those steps again.
    state, data_state, meta = checkpoints.restore(abstract, set_aside_damaged=True)
    position = data_position.own_position(data_state, records) if data_state else None
    damaged = (f" (damaged, set aside: step {', '.join(str(s) for s, _ in checkpoints.skipped)})"
               if checkpoints.skipped else "")
    return InitialState(state, state_sh, position, f"resumed from step {int(state.step)} "
                                                   f"of {checkpoints.directory}{damaged}",
                        dict(meta or {}))
  if init_checkpoint:
    kind, where = checkpoint_kind(init_checkpoint)
    if init_mode == "continue":
      if kind != "orbax":
        raise ValueError(f"init_checkpoint={init_checkpoint} is {KIND_NAMES[kind]}: weights, "
                         "but no state of this trainer to continue; set init_mode='params' to "
                         "start from its weights.")
      source = orbax_directory(where)
      other = checkpointing.CheckpointManager(source, max_to_keep=None, async_save=False)
      state, _, _ = other.restore(abstract)
      return InitialState(state, state_sh, None,
                          f"continuing {source} from step {int(state.step)}")
    if init_mode != "params":
      raise ValueError(f"init_mode={init_mode!r}; expected 'continue' or 'params'.")
    state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, seed, example,
                                                   objective.input_names, state_sh)
    scopes = objective.init_scopes
    subtree = f"params/{scopes[0]}" if scopes is not None and len(scopes) == 1 else "params"
    loaded = load_any(init_checkpoint, bert_config_file, subtree=subtree)
    fresh = jax.device_get(state.params)
    params = in_layout(loaded.params, loaded.config, model.config.scan_layers)
    params = select_scopes(params, fresh, objective.init_scopes, loaded.origin)
    merged = merge_params(fresh, extend_positions(params, fresh), where=loaded.origin)
    merged = objective.initialize_params(merged)
    return InitialState(state.replace(params=jax.device_put(merged, state_sh.params)),
                        state_sh, None,
                        f"weights from {init_checkpoint}{unused_note(loaded.report)}")
  state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, seed, example,
                                                 objective.input_names, state_sh)
  if type(objective).initialize_params is not Objective.initialize_params:
    params = objective.initialize_params(jax.device_get(state.params))
    state = state.replace(params=jax.device_put(params, state_sh.params))
  return InitialState(state, state_sh, None, "initialised from scratch")
