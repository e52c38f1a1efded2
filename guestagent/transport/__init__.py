"""What both sides of the vsock use to reach each other: addresses, dialling, the byte relay.

PyPI's grpcio is built without vsock ("VSOCK is not supported"), so vsock is bridged: the
agent binds AF_VSOCK itself and relays each admitted connection to the gRPC server's private
unix socket; the host client does the mirror image (a private unix socket whose connections
are relayed to vsock, or to a Cloud Hypervisor / Firecracker hybrid vsock).
"""
