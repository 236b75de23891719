"""Thin HTTP routes: read the request, hand it to the pipeline, write the reply."""

# The ASGI scope extension of a server that sends an HTTP/1.0 client a body without a
# length unframed, ended by closing the connection (as HTTP/1.0 reads it): the proxy's
# own protocol (protocol.CloseDelimited); forwarding.whole_for reads it.
CLOSE_DELIMITED = "llm_proxy.close_delimited"
