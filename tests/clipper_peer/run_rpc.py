"""Run Clipper's own Python model container (``containers/python/rpc.py``, unchanged) as a
conformance target.

    python run_rpc.py PATH/TO/rpc.py ERA HOST PORT INPUT_TYPE

ERA is 2016, 2017 or v3 (the commit the file comes from: f5f76d05, 9f396e0e, 9f25e3fc).
The 2016 and 2017 files are Python 2 code (they send ``str`` frames); run them with
Python 2.7, pyzmq and numpy.  The model is the conformance model (each input answered with
its length), written against rpc.py's ``ModelContainerBase``; the container is started the
way each era's entry point starts it (v3: its ``Server`` directly, without the metrics
process and the ``/model_is_ready.check`` file ``RPCService.start`` adds; the
``clipper_admin.metrics`` it imports is the stand-in beside this file).

This file is Python 2 and 3 both.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # clipper_admin stand-in


def load(path):
    if sys.version_info[0] == 2:  # noqa: UP036 - the 2016/2017 rpc.py run on Python 2
        import imp

        return imp.load_source("clipper_rpc", path)
    import importlib.util

    spec = importlib.util.spec_from_file_location("clipper_rpc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    path, era, host, port, input_type = sys.argv[1:6]
    port = int(port)
    rpc = load(path)
    import numpy as np

    def lengths(inputs):
        if era == "2016":  # 2016 responses are float32 arrays
            return np.array([len(x) for x in inputs], dtype=np.float32)
        return [str(len(x)) for x in inputs]

    class ConformModel(rpc.ModelContainerBase):
        def predict_ints(self, inputs):
            return lengths(inputs)

        predict_floats = predict_doubles = predict_bytes = predict_strings = predict_ints

    model = ConformModel()
    if era == "2016":
        rpc.start(model, host, port, "conform", 1, input_type)
    elif era == "2017":
        rpc.RPCService().start(model, host, port, "conform", 1, input_type)
    else:
        import zmq

        server = rpc.Server(zmq.Context(), host, port)
        server.model_name = "conform"
        server.model_version = "1"
        server.model_input_type = rpc.string_to_input_type(input_type)
        server.model = model
        server.run(collect_metrics=False)


if __name__ == "__main__":
    main()
