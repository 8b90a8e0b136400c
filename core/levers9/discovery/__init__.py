"""Finding what a machine really has: the built-in GPU discovery plugin and the parsing behind it.

- :mod:`~levers9.discovery.nvidia_smi`: the ``levers9_gpu_devices`` hookimpl that
  runs ``nvidia-smi`` (registered through the same entry point group as any
  third-party plugin);
- :mod:`~levers9.discovery.nvidia_smi_query`: parsing its CSV query output into
  :class:`~levers9.hooks.types.GpuDevice` records, apart from running it so it
  is tested on recorded outputs.
"""
