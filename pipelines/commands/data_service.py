"""Runs a tf.data service dispatcher or worker, so other machines run `kt train`'s input streams.

    kt data-service dispatcher --port 5050
    kt data-service worker --dispatcher host0:5050 --port 5051
    kt train ... --data-service grpc://host0:5050

Each stream of a run goes to one worker, which reads the prepared shards at
the paths the run names (shared storage) and sends the batches to the
trainer, in the order the trainer would have read them itself. The servers
are TensorFlow's own (`tf.data.experimental.service`); this command starts
one and serves until it is stopped.
"""

import socket
import sys

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.errors import ConfigError


def start_server(role, port=0, dispatcher=None, host=None):
    """Starts a tf.data service dispatcher or worker in this process.

    Args:
        role: str, "dispatcher" or "worker".
        port: int, the port to serve on (0: a free one).
        dispatcher: str, a worker's dispatcher, `HOST:PORT` or `grpc://HOST:PORT`.
        host: str or None, the name trainers reach a worker by (None: this
            machine's host name).

    Returns:
        the started `DispatchServer` or `WorkerServer`; its `target` (a
        dispatcher's) is what `data_service` takes.
    """
    import tensorflow as tf

    service = tf.data.experimental.service
    if role == "dispatcher":
        return service.DispatchServer(service.DispatcherConfig(port=port))
    if not dispatcher:
        raise ConfigError("a worker needs --dispatcher HOST:PORT")
    address = dispatcher.removeprefix("grpc://")
    host = host or socket.gethostname()
    config = service.WorkerConfig(
        dispatcher_address=address, worker_address=f"{host}:%port%", port=port
    )
    return service.WorkerServer(config)


def _serve(args):
    if args.port is None:
        args.port = 5050 if args.role == "dispatcher" else 5051
    server = start_server(args.role, args.port, args.dispatcher, args.host)
    if args.role == "dispatcher":
        address = f"grpc://{args.host or socket.gethostname()}:{args.port}"
        print(f"Dispatcher on port {args.port}: pass --data-service {address}", flush=True)
    else:
        print(f"Worker on port {args.port} of {args.dispatcher}", flush=True)
    server.join()


def main(argv=None, prog="kt data-service"):
    parser = command_parser(prog, __doc__.splitlines()[0])
    parser.add_argument("role", choices=("dispatcher", "worker"))
    parser.add_argument(
        "--port", type=int, help="the port to serve on (default: 5050 a dispatcher, 5051 a worker)"
    )
    parser.add_argument("--dispatcher", help="a worker's dispatcher, HOST:PORT")
    parser.add_argument("--host", help="the name trainers reach it by (default: its host name)")
    return run(_serve, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
