"""Constructor arguments renamed in 0.2.0, still read from saved configs (private)."""


def renamed(config, renames):
    """`config` with each old argument name of `renames` (old -> new) replaced.

    `.keras` files and checkpoints saved by 0.1.0 store the old names; their
    weights are unaffected (they are named by the layers' `name`s).
    """
    config = dict(config)
    for old, new in renames.items():
        if old in config and new not in config:
            config[new] = config.pop(old)
    return config
