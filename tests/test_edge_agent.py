"""The agent's Python wrapper without a kernel: the configuration file it writes for the agent
binary lives as long as the wrapper, whether or not anybody calls close()."""
from __future__ import annotations

import gc
import os

from ccselect.export.edge.agent import EdgeAgent, EdgeConfig


def test_the_config_file_goes_with_the_wrapper(tmp_path):
    a = EdgeAgent(EdgeConfig(node_id="n1"))
    path = a.config_path
    assert os.path.exists(path) and EdgeConfig.from_yaml(path).node_id == "n1"
    a.close()
    a.close()                                   # twice is harmless
    assert not os.path.exists(path)
    b = EdgeAgent(EdgeConfig(node_id="n2"))
    path = b.config_path
    del b
    gc.collect()
    assert not os.path.exists(path), "a wrapper dropped without close() left its config file behind"
    # a config file the caller owns is never removed
    own = tmp_path / "edge.yaml"
    own.write_text(EdgeConfig(node_id="n3").to_yaml())
    c = EdgeAgent(config_path=str(own))
    assert c.config.node_id == "n3"
    c.close()
    del c
    gc.collect()
    assert own.exists()
