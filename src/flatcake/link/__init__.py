"""The link to the node service (``flatcake serve``): its wire format (``wire``), a
bounded call and a worker's files (``client``), the books seen through it
(``control.RemoteControl``), and which socket, listener and files both sides trust
(``trust``). Every host attached to the service uses these; the service
itself lives in ``flatcake.service``.
"""
