"""Scale-out roles (``streamsvi run --role worker|applier``): README "Scaling out", docs/design.md.

``transport`` (delta messages, λ files), ``apply`` (the applier's step), ``worker``, ``applier``.
"""
