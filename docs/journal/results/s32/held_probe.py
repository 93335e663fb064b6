"""Session 32: a CheckpointManager delta's save time by chain depth, the newest checkpoint held
as decoded (cache_decoded=True) or not (False), on the demo GPT's state (10.75M parameters,
AdamW: 130 MB raw). Synchronous saves, so the save's own time is what is timed; the two settings
alternate per mode, twice each. Prints one JSON line per run."""

import copy
import json
import shutil
import sys
import tempfile
import time

from ckptzip.demo.train import CONFIGS, load_data, make_trainer
from ckptzip.manager import CheckpointManager

modes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["lossless", "adaptive", "excp", "bitsnap"]
trainer = make_trainer(CONFIGS["small"], 200, 0)
train, _ = load_data(CONFIGS["small"])
trainer.train(train, 20)
states = [copy.deepcopy(trainer.state())]
for _ in range(7):
    trainer.train(train, 5)
    states.append(copy.deepcopy(trainer.state()))

for mode in modes:
    for repeat in range(2):
        for cache in (False, True):
            directory = tempfile.mkdtemp(dir="/tmp")
            seconds = []
            with CheckpointManager(directory, mode=mode, keyframe_every=8, async_save=False,
                                   cache_decoded=cache) as manager:
                for step, state in enumerate(states):
                    started = time.perf_counter()
                    manager.save(step, state)
                    seconds.append(round(time.perf_counter() - started, 3))
            sizes = [len(open(f"{directory}/step-{s:08d}.ckz", "rb").read()) for s in range(8)]
            shutil.rmtree(directory)
            print(json.dumps({"mode": mode, "repeat": repeat, "cache_decoded": cache,
                              "seconds_by_depth": seconds, "bytes": sizes}), flush=True)
