"""lmdeploy/serve/openai (v0.16.0): api_server.serve, launch_server."""
