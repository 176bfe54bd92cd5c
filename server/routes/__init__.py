"""The HTTP routes, one file per API family: OpenAI, Anthropic, Responses, llama-server's
native routes, infill, embeddings, LoRA, slot files, the CORS proxy, the web page."""
