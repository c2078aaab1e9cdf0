from deepspeed.pipe import PipelineModule


class ExactPartitionPipelineModule(PipelineModule):
    """PipelineModule with the stage boundaries given as ``parts``
    (len num_stages + 1, as PipelineModule.parts)."""

    def __init__(self, *args, parts, **kwargs):
        self._exact_parts = [int(x) for x in parts]
        super().__init__(*args, **kwargs)

    def _partition_layers(self, method="uniform"):
        num_stages = self._topo.get_dim("pipe")
        stage_id = self._topo.get_coord(self.global_rank).pipe
        parts = self._exact_parts
        if len(parts) != num_stages + 1 or parts[0] != 0 or parts[-1] != len(self._layer_specs):
            raise ValueError(f"parts {parts} do not fit {num_stages} stages of {len(self._layer_specs)} layers")
        self.parts = list(parts)
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])


PARTS = [0, 18, 34]  # layer boundaries, len = num_stages + 1
ACTIVATION_CHECKPOINT_INTERVAL = 0  # recompute 'selective'


def topology():
    """The ranks of the plan's stages and replicas (PipelineModule's topology=)."""
    from deepspeed.runtime.pipe.topology import ProcessTopology

    return ProcessTopology(axes=['data', 'pipe'], dims=[8, 2])
