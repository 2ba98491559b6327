"""lmdeploy/cli/entrypoint.py and cli/serve.py (v0.16.0), `lmdeploy serve
api_server` only: the options the metrics path depends on (--backend,
--dp, --tp, --ep, --session-len, --disable-metrics, --model-name), and
SubCliServe.api_server's choice: one server in this process when dp == 1
or the backend is turbomind, else launch_server() spawning one per dp
rank."""
import argparse
import sys


def run():
    parser = argparse.ArgumentParser(prog="lmdeploy")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve_sub = serve.add_subparsers(dest="server", required=True)
    api = serve_sub.add_parser("api_server")
    api.add_argument("model_path")
    api.add_argument("--model-name", default=None)
    api.add_argument("--backend", default="pytorch",
                     choices=("pytorch", "turbomind"))
    api.add_argument("--dp", type=int, default=1)
    api.add_argument("--tp", type=int, default=1)
    api.add_argument("--ep", type=int, default=1)
    api.add_argument("--session-len", type=int, default=32768)
    api.add_argument("--disable-metrics", action="store_true")
    args = parser.parse_args(sys.argv[1:])

    from lmdeploy.messages import PytorchEngineConfig
    backend_config = PytorchEngineConfig(
        dp=args.dp, tp=args.tp, ep=args.ep, session_len=args.session_len,
        enable_metrics=not args.disable_metrics)
    kwargs = dict(model_name=args.model_name, backend=args.backend,
                  backend_config=backend_config)
    if args.dp == 1 or args.backend == "turbomind":
        from lmdeploy.serve.openai.api_server import serve as run_api_server
        run_api_server(args.model_path, **kwargs)
    else:
        from lmdeploy.serve.openai.launch_server import launch_server
        launch_server(1, 0, args.model_path, **kwargs)
    return 0
