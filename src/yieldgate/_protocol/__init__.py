"""The governed protocol's pieces, one concern a module, public through ``yieldgate.protocol``.

- ``vocabulary``: the version, the limits and the enumerations frames spell.
- ``codec``: one frame as bytes (the JSON line, UTF-8, the body's SHA-256).
- ``requests``: request frames: their records, the server's validating
  decoder, and the builders a client sends.
- ``replies``: reply frames: the builders a server sends, their records, and
  the client's decoder.

Only the standard library and ``yieldgate._exceptions`` (the server imports
these and never the gate). Import the public names from ``yieldgate.protocol``.
"""
