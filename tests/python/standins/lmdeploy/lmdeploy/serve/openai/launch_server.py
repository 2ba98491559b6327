"""lmdeploy/serve/openai/launch_server.py (v0.16.0): launch_server() for
dp > 1: multiprocessing's start method set to spawn, one process per dp
rank of this node running _run_server -> api_server.serve with a copy of
the backend config whose dp_rank is that rank; it waits for them."""
import copy
import multiprocessing as mp
import os

from lmdeploy.serve.openai.api_server import serve


def _run_server(gpu_ids, model_path, **kwargs):
    if gpu_ids:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    serve(model_path, **kwargs)


def launch_server(num_nodes, node_rank, model_path, backend_config,
                  **kwargs):
    mp.set_start_method("spawn", force=True)
    dp = backend_config.dp
    assert dp > 1, f"only support dp > 1, but give dp={dp}"
    assert backend_config.tp > 1 or backend_config.ep > 1, \
        "only support tp > 1 or ep > 1"
    per_node = dp // num_nodes
    procs = []
    for idx in range(per_node):
        cfg = copy.deepcopy(backend_config)
        cfg.dp_rank = node_rank * per_node + idx
        p = mp.Process(target=_run_server, args=([], model_path),
                       kwargs=dict(kwargs, backend_config=cfg))
        p.start()
        procs.append(p)
    for p in procs:
        p.join()
        assert p.exitcode == 0, f"server exited with {p.exitcode}"
