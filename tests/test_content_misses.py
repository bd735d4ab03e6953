"""bench/content_check/content_misses.py against a hand-made content check: counts and onset habits planted by hand."""

import json

from bench.lib.tiny import read_misses


def _truth(shapes: int, bounces: int) -> dict:
    return {"shapes": [{}] * shapes, "events": [{"kind": "bounce", "t": 1.0 + i} for i in range(bounces)]
            + [{"kind": "appear", "t": 0.5}]}


def test_one_bounce_clips_without_a_bounce_and_the_onsets_each_seed_repeats():
    suite = [json.dumps({"id": f"p{i}", "ground_truth": t})
             for i, t in enumerate([_truth(1, 1), _truth(1, 1), _truth(2, 1), _truth(1, 2)])]
    clip = lambda pid, seed, seen, onsets: {"prompt_id": pid, "seed": seed,  # noqa: E731
                                            "details": {"bounces_seen": seen, "onsets": onsets}}
    check = {"rows": {"baseline": {"clips": [
        clip("p0", 0, {"red": []}, [3.221, 4.1]),
        clip("p1", 0, {"blue": [2.0]}, [3.224]),
        clip("p2", 0, {"red": [], "blue": []}, [3.219, 1.0]),  # two shapes: not a one-bounce clip
        clip("p3", 1, {"green": []}, [4.05, 4.049]),
        clip("p0", 1, {"red": []}, []),
    ]}}}
    result = read_misses(check, suite + [""], "baseline")
    assert result["clips"] == 5
    assert [(o["prompt_id"], o["seed"], o["bounces_seen"]) for o in result["one_bounce_clips"]] == [
        ("p0", 0, 0), ("p1", 0, 1), ("p0", 1, 0)]
    assert result["one_bounce_without_bounce"] == 2
    assert result["onsets_by_seed"]["0"][0] == (3.22, 3)
    assert dict(result["onsets_by_seed"]["0"]) == {3.22: 3, 4.1: 1, 1.0: 1}
    assert result["onsets_by_seed"]["1"] == [(4.05, 2)]
