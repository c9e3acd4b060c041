"""The training core: the objective interface, the sharded train state, the one step builder,
the one loop, the optimizer, Orbax checkpoints, metric writers and throughput accounting."""
