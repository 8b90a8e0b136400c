"""What the cloud provider plugins (``ec2``, ``oci``, ``lambda_labs``) share, so each writes it once.

Their plugin objects derive from :class:`levers9.hooks.provider.ProviderPlugin`, as every
built-in provider does (the settings hook, the context, clients closed at shutdown).


* :mod:`levers9.clouds.settings`: the base of a cloud pool's settings model
  (the region is the pool's, never a setting, and must look like the cloud's);
* :mod:`levers9.clouds.calls`: running one SDK call so that a failure whose
  meaning the plugin knows is raised as levers9's typed error, and any other
  failure propagates unchanged;
* :mod:`levers9.clouds.price_files`: the on-demand price catalogs a plugin
  ships as a JSON file next to its code, read once per process, and rebuilt
  atomically by the plugin's ``prices refresh`` command.

Nothing here imports a cloud SDK or knows a provider's names: what differs
between clouds (error codes, price lists, regions) stays in each plugin.
"""
