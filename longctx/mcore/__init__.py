"""The one megatron-core layer: model building, torch_dist state, process groups and every CPU shim."""
