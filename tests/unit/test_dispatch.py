"""The bounded dispatcher: never more than `limit` calls in flight, every outcome handed back, and
a stage that stops moving says what it waits for instead of hanging."""

import pytest

from vlm_decade.core.dispatch import Stalled, bounded


class FakeRay:
    """Calls finish in the order given by `finish_order` (indexes of submitted calls); `wait`
    reports a timeout when told nothing finishes."""

    def __init__(self, results, stuck=False):
        self.results, self.stuck = results, stuck
        self.in_flight, self.max_in_flight = set(), 0

    def submit(self, item, slot):
        ref = ("ref", item, slot)
        self.in_flight.add(ref)
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        return ref

    def wait(self, refs, num_returns, timeout=None):
        if self.stuck:
            return [], refs
        ref = sorted(refs, key=lambda r: -r[1])[0]  # the newest finishes first: out of order
        return [ref], [r for r in refs if r != ref]

    def get(self, ref):
        self.in_flight.discard(ref)
        value = self.results[ref[1]]
        if isinstance(value, Exception):
            raise value
        return value

    def available_resources(self):
        return {"CPU": 0.0, "GPU": 0.0}


def test_every_item_once_within_the_limit_and_failures_handed_back():
    results = {i: i * i for i in range(10)}
    results[4] = ValueError("batch 4 failed")
    ray = FakeRay(results)
    done = list(bounded(ray, range(10), ray.submit, 3))
    assert sorted(d.work for d in done) == list(range(10))
    assert ray.max_in_flight == 3
    assert {d.work: d.value for d in done if d.error is None} == {i: i * i for i in range(10) if i != 4}
    (failed,) = [d for d in done if d.error is not None]
    assert failed.work == 4 and "batch 4" in str(failed.error)


def test_slots_are_reused_so_each_actor_keeps_its_share():
    ray = FakeRay({i: i for i in range(12)})
    slots = []
    list(bounded(ray, range(12), lambda item, slot: slots.append(slot) or ray.submit(item, slot), 4))
    assert set(slots) == {0, 1, 2, 3} and len(slots) == 12


def test_a_stalled_stage_names_what_it_waits_for():
    ray = FakeRay({0: 0}, stuck=True)
    with pytest.raises(Stalled, match=r"describe \(m\): no call finished in 5s.*1 CPU, 1 GPU.*0 CPU, 0 GPU free"):
        list(bounded(ray, range(3), ray.submit, 2, stall_timeout_s=5, what="describe (m)", needs={"CPU": 1, "GPU": 1}))


class LostActor(Exception):
    pass


class PoolRay(FakeRay):
    """Actors are ints; `dead` ones die as they start (their node lost); `unplaced` ones never start
    (no room), so neither they nor calls sent to them ever finish."""

    def __init__(self, dead=(0,), unplaced=()):
        super().__init__({})
        self.dead, self.unplaced, self.killed, self.made = set(dead), set(unplaced), [], 0

    def make(self):
        self.made += 1
        return self.made - 1

    def ready(self, actor):
        return ("ready", actor, actor)

    def call(self, actor, item):
        assert actor not in self.unplaced, "work sent to an actor that is not up"
        ref = ("ref", item, actor)
        self.in_flight.add(ref)
        return ref

    def wait(self, refs, num_returns, timeout=None):
        movable = [r for r in refs if r[2] not in self.unplaced]
        return super().wait(movable, num_returns, timeout) if movable else ([], refs)

    def get(self, ref):
        from ray.exceptions import ActorDiedError

        self.in_flight.discard(ref)
        if ref[2] in self.dead:
            raise ActorDiedError()
        return None if ref[0] == "ready" else (ref[1], ref[2])

    def kill(self, actor):
        self.killed.append(actor)


def test_a_lost_actor_leaves_the_pool_and_the_others_take_its_work():
    from vlm_decade.core.dispatch import pool_map

    ray = PoolRay(dead=(0,))
    done = list(pool_map(ray, ray.make, 2, range(8), ray.call, in_flight_per_actor=2, ready=ray.ready))
    assert sorted(d.work for d in done) == list(range(8)) and all(d.error is None for d in done)
    assert {d.value[1] for d in done} == {1}  # all by the survivor
    assert ray.killed.count(0) == 1 and ray.made == 2


class NodeLostRay(PoolRay):
    """Actor 1 starts, then its node is lost: every call it holds dies, as Ray says it (with the IP)."""

    def __init__(self):
        super().__init__(dead=())

    def get(self, ref):
        from ray.exceptions import ActorDiedError, RayActorError

        if ref[0] == "ref" and ref[2] == 1:
            self.in_flight.discard(ref)
            died = ActorDiedError()
            RayActorError.__init__(died, "id", "The actor died unexpectedly.\n\tclass_name: A\n\tip: 10.0.0.12\nlost")
            raise died
        return super().get(ref)


def test_a_lost_actor_is_told_once_with_its_node_and_the_batches_others_redo():
    from vlm_decade.core.dispatch import LostActor, pool_map

    ray, told = NodeLostRay(), []
    done = list(
        pool_map(
            ray, ray.make, 2, range(8), ray.call, in_flight_per_actor=2, ready=ray.ready, what="w", on_lost=told.append
        )
    )
    assert sorted(d.work for d in done) == list(range(8)) and all(d.error is None for d in done)
    assert {d.value[1] for d in done} == {0}
    assert told == [LostActor("w", "10.0.0.12", 2)]  # both calls it held, told once


def test_when_every_actor_is_lost_a_new_one_is_made_and_losses_are_capped():
    from vlm_decade.core.dispatch import pool_map

    ray = PoolRay(dead=(0,))
    done = list(pool_map(ray, ray.make, 1, range(3), ray.call, ready=ray.ready))
    assert ray.made == 2 and all(d.error is None and d.value[1] == 1 for d in done)
    ray = PoolRay(dead=range(100))  # no actor ever lives: after max_lost, the work comes back failed
    done = list(pool_map(ray, ray.make, 1, range(5), ray.call, max_lost=2, ready=ray.ready))
    assert sorted(d.work for d in done) == list(range(5)) and all(d.error is not None for d in done)
    assert ray.made == 3


def test_an_actor_that_never_starts_holds_no_work():
    """Three actors asked for, room for two (the cluster still counted a node that was gone): the two
    do all the work and the third, never up, is killed at the end; nothing stalls."""
    from vlm_decade.core.dispatch import pool_map

    ray = PoolRay(dead=(), unplaced=(2,))
    done = list(pool_map(ray, ray.make, 3, range(10), ray.call, stall_timeout_s=5, ready=ray.ready))
    assert sorted(d.work for d in done) == list(range(10)) and all(d.error is None for d in done)
    assert 2 not in {d.value[1] for d in done} and sorted(ray.killed) == [0, 1, 2]
    ray = PoolRay(dead=(), unplaced=(0,))  # the only actor never starts: said, not hung
    with pytest.raises(Stalled):
        list(pool_map(ray, ray.make, 1, range(3), ray.call, stall_timeout_s=5, ready=ray.ready))


class BrokenRay(PoolRay):
    """Every actor's constructor raises (a model that cannot load), as Ray reports it: in text."""

    def __init__(self):
        super().__init__(dead=range(100))

    def get(self, ref):
        from ray.exceptions import ActorDiedError, RayActorError

        self.in_flight.discard(ref)
        died = ActorDiedError()
        trace = f'ray::A.__init__() (pid=1)\n  File "a.py", line 1, in __init__\n    load()\nOSError: no weights in {ref[2]}'
        RayActorError.__init__(died, "id", f"The actor died because of an error raised in its creation task, {trace}")
        died._actor_init_failed = True
        raise died


def test_an_actor_whose_constructor_raises_is_not_made_again_and_the_work_fails_with_its_error():
    from vlm_decade.core.dispatch import pool_map
    from vlm_decade.core.errors import error_text

    ray = BrokenRay()
    told = []
    done = list(pool_map(ray, ray.make, 2, range(5), ray.call, max_lost=3, ready=ray.ready, on_lost=told.append))
    assert sorted(d.work for d in done) == list(range(5)) and ray.made == 2  # no third actor tried
    assert told == []  # not lost: it could not start
    # the cause the first failed actor gave (the fake finishes the newest call first: actor 1)
    assert {error_text(d.error) for d in done} == {"OSError: no weights in 1"}


def test_the_node_a_lost_actor_was_on_is_read_from_rays_message():
    from ray.exceptions import ActorDiedError, RayActorError

    from vlm_decade.core.dispatch import lost_node

    died = ActorDiedError()
    RayActorError.__init__(died, "id", "The actor died unexpectedly.\n\tclass_name: A\n\tpid: 7\n\tip: 10.0.0.12\nlost")
    assert lost_node(died) == "10.0.0.12" and lost_node(ActorDiedError()) is None
