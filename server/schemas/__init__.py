"""Request bodies, their shared field types, the answer models of the OpenAPI document, and
the document itself."""
