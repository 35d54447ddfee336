"""The cluster: a pipeline's units shared by the live workers of one engine.

``host`` (the :class:`~egress.runtime.hosts.Host` of a cluster worker) runs a ``worker``
(membership, leases, hand-overs) whose units ``assignment`` computes; ``drained`` tells from the
engine alone whether the whole pipeline is drained; ``throttler_role`` elects the throttler
controller among the workers of an engine on a message bus.
"""
