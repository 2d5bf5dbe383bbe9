"""What answers and what encodes: local backends (`backends`), text encoders (`encoders`), pairwise
text metrics (`metrics`), and the transport to the OpenAI and Gemini APIs (`api`)."""
