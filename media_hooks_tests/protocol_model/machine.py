"""The rules: the production statements, driven from several sessions at once.

Three workers, a producer and an operator each have a session of their own (``sessions``).
A worker's steps (claim a page and publish it, lease with permits, send and record an outcome)
pile up in one open transaction that a later rule commits or rolls back, or that ends with the
worker (its backend ended mid-statement or between statements). A statement that waits on a lock
another session holds stays waiting while other rules run. After every rule the invariants are
checked on what has committed (``invariants``, ``model``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg
from hypothesis import currently_in_test_context, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from psycopg.rows import dict_row

from media_hooks.core.config import Settings
from media_hooks.http import outcomes
from media_hooks.outbox import claims, destinations, emit, leases, rate_limits
from media_hooks.outbox.cohort import Cohort
from media_hooks.outbox.destinations import DestinationSpec
from media_hooks.outbox.leases import Classified, Lease
from media_hooks.outbox.maintenance import discard, requeue, retention, sweeps
from media_hooks_tests.protocol_model import invariants
from media_hooks_tests.protocol_model.model import Model
from media_hooks_tests.protocol_model.sessions import Actor, Held
from media_hooks_tests.protocol_model.trace import Trace

LEASE_SECONDS = 30.0
URL = "http://127.0.0.1:9/"
SECRETS = ("whsec_b25lIHNlY3JldA==", "whsec_YW5vdGhlciBvbmU=")
# Every destination's limits: (rate per second, burst); in flight 4, three attempts.
LIMITS = (20.0, 2)
PLAIN, ORDERED, LATEST, SWITCHED = "plain", "ordered", "latest", "switched"
# The first is the one the search tries most: the destination with the most rules.
DESTINATIONS = (LATEST, ORDERED, PLAIN, SWITCHED)
ASSETS = ("a1", "a2")
EVENT_TYPES = ("media.ready", "media.gone")
WORKERS = 3
CHANGES = ("disable", "enable", "pause", "rotate secret", "ordering on", "coalescing on")
# What a receiver answered (the contract's classes), as the sender classifies it; "lost": the
# request went out and the worker never learnt the answer (it records nothing).
ANSWERS: dict[str, tuple[str, int | None, float | None, bool]] = {
    "2xx": (outcomes.SUCCESS, 200, None, True),
    "4xx": (outcomes.REJECTED, 400, None, True),
    "410": (outcomes.REJECTED, 410, None, True),
    "429 Retry-After": (outcomes.RATE_LIMITED, 429, 0.3, True),
    "429": (outcomes.RATE_LIMITED, 429, None, True),
    "5xx": (outcomes.RETRYABLE, 503, None, True),
    "timeout": (outcomes.AMBIGUOUS, None, None, True),
    "not sent": (outcomes.RETRYABLE, None, None, False),
    "lost": ("", None, None, True),
}
# Most answers are successes, as on a healthy publisher; every other answer stays as likely.
ANSWER_CHOICES = ("2xx", "2xx", "2xx", *sorted(ANSWERS))
TABLES = (
    "delivery_state, delivery_timer, delivery_body, delivery_history, delivery_attempt_v2, "
    "dispatch_outbox_v3, webhook_delivery_v1, delivery_attempt_v1, dispatch_outbox_v2, "
    "delivery_identity, delivery_tombstone_0003, destination_limiter, destination_subscription, "
    "webhook_destination, webhook_event, delivery_requeue, delivery_requeue_item"
)


@dataclass
class Figures:
    """What the runs did, for the long profile's report."""

    sequences: int = 0
    steps: int = 0
    rules: Counter = field(default_factory=Counter)
    # What the workers' steps came to: leases taken, outcomes recorded by the state they led to.
    outcomes: Counter = field(default_factory=Counter)
    counterexamples: list[str] = field(default_factory=list)


def _settings() -> Settings:
    return dataclasses.replace(Settings.from_env(), allow_private_urls=True)


def _spec(destination_id: str, **changes: Any) -> DestinationSpec:
    return DestinationSpec(destination_id, URL, **changes)


class ProtocolMachine(RuleBasedStateMachine):
    database_url: ClassVar[str]
    figures: ClassVar[Figures] = Figures()

    def __init__(self) -> None:
        super().__init__()
        self.trace = Trace()
        self.observer = psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row)
        self.observer.execute(f"TRUNCATE {TABLES} CASCADE")
        # The operator's commands and the sweeps run as they do in production: each statement,
        # or the transaction the function opens, commits on its own.
        self.operator = Actor("operator", self.database_url, self.trace, autocommit=True)
        self.producer = Actor("producer", self.database_url, self.trace)
        self.workers = [Actor(f"worker-{n}", self.database_url, self.trace) for n in (1, 2, 3)]
        self.model = Model()
        # What the operator's running step may do to the rows (model.StepFacts), until it ends.
        self.operating: str | None = None
        self.dead_runs: list[str] = []
        self.commit_emits = True
        self.ordered = {ORDERED}
        self.coalescing = {LATEST}
        self._add_destinations()
        self.figures.sequences += 1

    def _add_destinations(self) -> None:
        rate, burst = LIMITS
        common = dict(
            secrets=SECRETS[:1],
            rate_per_second=rate,
            burst=burst,
            max_in_flight=4,
            max_attempts=3,
            backoff_base_seconds=0.1,
            backoff_cap_seconds=0.2,
            allow_private_url=True,
            event_types=("media.*",),
        )
        scopes = {ORDERED: dict(ordering="asset"), LATEST: dict(coalescing="asset")}
        for destination_id in DESTINATIONS:
            spec = _spec(destination_id, **common, **scopes.get(destination_id, {}))
            destinations.upsert_destination(self.operator.conn, spec, _settings())

    def _actors(self) -> list[Actor]:
        return [self.operator, self.producer, *self.workers]

    def _begin(self, name: str) -> None:
        """Every rule starts here: the sessions' waiting statements that have ended are taken
        in, and the rule is counted."""
        for actor in self._actors():
            actor.settle(self.observer)
        self.figures.steps += 1
        self.figures.rules[name] += 1

    def _commit(self, actor: Actor) -> bool:
        given: Held | None = actor.commit()
        if given is None:
            return False
        self.model.committed_successes(given.successes)
        self.figures.outcomes["successes committed"] += len(given.successes)
        self.model.committed_grants(given.grants)
        return True

    @initialize(commit_emits=st.booleans())
    def producer_habit(self, commit_emits) -> None:
        """A producer that commits each emit at once, or one whose emits wait in its open
        transaction until a rule ends it."""
        self.commit_emits = commit_emits

    # --- the producer -------------------------------------------------------------------

    @rule(kind=st.sampled_from(["single", "bulk", "event", "purged again"]), data=st.data())
    def produce(self, kind, data) -> None:
        """The producer emits: one delivery, a batch, an event fanned out, or a purged id
        again. One rule among the others, so that emitting does not crowd out the workers."""
        if kind == "single":
            self.emit_single(
                data.draw(st.sampled_from(DESTINATIONS)),
                data.draw(st.sampled_from(ASSETS)),
                data.draw(st.sampled_from(EVENT_TYPES)),
                data.draw(st.integers(0, 2)),
                data.draw(st.one_of(st.none(), st.integers(0, 3))),
            )
        elif kind == "bulk":
            one = st.tuples(
                st.sampled_from(DESTINATIONS),
                st.sampled_from(ASSETS),
                st.sampled_from(EVENT_TYPES),
                st.integers(0, 2),
            )
            self.emit_bulk(data.draw(st.lists(one, min_size=1, max_size=3)))
        elif kind == "event":
            self.emit_event(
                data.draw(st.integers(0, 3)),
                data.draw(st.sampled_from(ASSETS)),
                data.draw(st.sampled_from(EVENT_TYPES)),
            )
        else:
            self.emit_purged_again(data.draw(st.integers(0, 1000)))

    def emit_single(self, destination, asset, event_type, n, explicit) -> None:
        self._begin("emit_single")
        delivery_id = None if explicit is None else f"id-{destination}-{explicit}"
        event = emit.Event(destination, asset, event_type, {"n": n}, delivery_id)
        self._produce(lambda: emit.emit(self.producer.conn, event))

    def emit_bulk(self, events) -> None:
        self._begin("emit_bulk")
        batch = [emit.Event(d, a, t, {"n": n}) for d, a, t, n in events]
        self._produce(lambda: emit.emit_many(self.producer.conn, batch))

    def emit_event(self, event_no, asset, event_type) -> None:
        """An event fanned out to its subscribers; an event_id may repeat."""
        self._begin("emit_event")
        event = emit.FanOutEvent(f"ev-{event_no}", asset, event_type, {"n": event_no})
        self._produce(lambda: emit.emit_event(self.producer.conn, event))

    def emit_purged_again(self, pick) -> None:
        """A purged id, emitted again within the duplicate window, is refused."""
        self._begin("emit_purged_again")
        if not self.model.purged:
            return
        delivery_id, destination_id = sorted(self.model.purged.items())[
            pick % len(self.model.purged)
        ]
        event = emit.Event(destination_id, "a1", "media.ready", {"n": 0}, delivery_id)

        def done(result: Any) -> None:
            if isinstance(result, emit.EmitResult):
                assert not result.inserted, f"purged {delivery_id} was recorded again"

        self._produce(lambda: emit.emit(self.producer.conn, event), done)

    def _produce(self, action, done=lambda result: None) -> None:
        if self.producer.busy:
            return
        self.producer.start(self.observer, action, done)
        if not self.producer.busy and self.commit_emits:
            self._commit(self.producer)

    @precondition(lambda self: self.producer.in_transaction and not self.producer.busy)
    @rule(commit=st.booleans())
    def producer_ends_transaction(self, commit) -> None:
        self._begin("producer_ends_transaction")
        if self.producer.busy:
            return
        if commit:
            self._commit(self.producer)
        else:
            self.producer.rollback()

    # --- the workers --------------------------------------------------------------------

    def _worker(self, index: int, holding=lambda held: True) -> Actor | None:
        """The ``index``-th of the idle workers that hold what the step needs."""
        ready = [w for w in self.workers if not w.busy and holding(w.held)]
        return ready[index % len(ready)] if ready else None

    @rule(
        index=st.integers(0, WORKERS - 1),
        pick=st.integers(0, 3),
        page_size=st.integers(1, 3),
        then=st.sampled_from(["lease and send", "lease", "stop"]),
        answer=st.sampled_from(ANSWER_CHOICES),
    )
    def claim(self, index, pick, page_size, then, answer) -> None:
        """A worker claims a page of one destination with due deliveries (its own transaction,
        or a savepoint of the open one) and publishes it, as engine/pages.py does; ``then``:
        the worker goes on in the same rule to lease the page, and to send its first lease (a
        later rule may still stop it between any two of these statements)."""
        self._begin("claim")
        worker = self._claim(index, pick, page_size)
        if worker is None or worker.busy or then == "stop":
            return
        self._lease(worker, 0, page_size)
        if worker.busy or then == "lease" or not worker.held.leases:
            return
        self._send(worker, len(worker.held.leases) - 1, answer, twice=False)

    def _claim(self, index, pick, page_size) -> Actor | None:
        worker = self._worker(index)
        if worker is None:
            return
        committed = not worker.in_transaction
        found = {"destination": ""}

        def action() -> list:
            due = claims.due_destinations(worker.conn, Cohort())
            if not due:
                return []
            destination = found["destination"] = due[pick % len(due)]
            page = claims.claim_destination_page(
                worker.conn, worker.run_id, destination, Cohort(), page_size
            )
            return page

        def done(page: Any) -> None:
            if isinstance(page, list) and page:
                self.figures.outcomes["claimed"] += len(page)
                mine = worker.held.messages.setdefault(found["destination"], [])
                mine += [(m, committed) for m in page]

        worker.start(self.observer, action, done)
        return worker

    @precondition(lambda self: self._worker(0, lambda held: any(held.messages.values())))
    @rule(index=st.integers(0, WORKERS - 1), pick=st.integers(0, 3), want=st.integers(1, 3))
    def lease(self, index, pick, want) -> None:
        """lease_with_permits on one destination the worker holds messages of, handing back
        the slots of the leases recorded since."""
        self._begin("lease")
        worker = self._worker(index, lambda held: any(held.messages.values()))
        if worker is not None:
            self._lease(worker, pick, want)

    def _lease(self, worker: Actor, pick: int, want: int) -> None:
        holding = sorted(d for d, ms in worker.held.messages.items() if ms)
        if not holding:
            return
        destination = holding[pick % len(holding)]
        offered = [m for m, _ in worker.held.messages[destination]][:want]
        returned = worker.held.release.pop(destination, [])

        def action() -> leases.LeaseStep:
            return leases.lease_with_permits(
                worker.conn,
                worker.run_id,
                destination,
                offered,
                holder=worker.run_id,
                lease_seconds=LEASE_SECONDS,
                release_slots=returned,
            )

        def done(step: Any) -> None:
            if not isinstance(step, leases.LeaseStep):
                return
            if not step.leases:
                reason = str(step.grant.reason).split(" until")[0]
                self.figures.outcomes[f"leased none: {reason}"] += 1
            held = worker.held
            held.messages[destination] = held.messages[destination][step.examined :]
            for taken, slot, start_at in zip(
                step.leases, step.grant.slots, step.grant.start_at, strict=True
            ):
                held.leases.append((taken, destination, slot, False))
                self.figures.outcomes["leased"] += 1
                held.grants.append((destination, start_at))

        worker.start(self.observer, action, done)

    @precondition(lambda self: self._worker(0, lambda held: bool(held.leases)))
    @rule(
        index=st.integers(0, WORKERS - 1),
        pick=st.integers(0, 10),
        answer=st.sampled_from(ANSWER_CHOICES),
        twice=st.booleans(),
    )
    def send(self, index, pick, answer, twice) -> None:
        """The receiver answers one leased delivery; the worker records it with
        record_classified (``twice``: the same outcome recorded again, a retried batch)."""
        self._begin("send")
        worker = self._worker(index, lambda held: bool(held.leases))
        if worker is not None:
            self._send(worker, pick, answer, twice)

    def _send(self, worker: Actor, pick: int, answer: str, twice: bool) -> None:
        taken, destination, slot, _ = worker.held.leases.pop(pick % len(worker.held.leases))
        worker.held.release.setdefault(destination, []).append(slot)
        outcome, status, retry_after, attempted = ANSWERS[answer]
        if not outcome:
            self.trace.event(worker.name, f"sends {taken.delivery_id}; the answer is lost")
            return
        self.trace.event(worker.name, f"sends {taken.delivery_id}; answer {answer}")
        classified = _classified(taken, outcome, status, retry_after, attempted)

        def action() -> list[leases.Recorded]:
            batches = [classified] * (2 if twice else 1)
            return [leases.record_classified(worker.conn, [c]) for c in batches]

        def done(recorded: Any) -> None:
            if isinstance(recorded, list):
                for one in recorded:
                    self.figures.outcomes.update(f"recorded {s}" for s in one.states.values())
                    worker.held.successes += [
                        d for d, state in one.states.items() if state == "succeeded"
                    ]

        worker.start(self.observer, action, done)

    @rule(
        index=st.integers(0, WORKERS - 1),
        end=st.sampled_from(["commit", "commit", "commit", "rollback", "dies"]),
    )
    def worker_ends_transaction(self, index, end) -> None:
        """The worker commits, rolls back, or dies: its process ends, in a statement or
        between two, and its run is over."""
        self._begin(f"worker_{end}")
        if end == "dies":
            self.worker_dies(index)
            return
        worker = self._worker(index, lambda held: True)
        if worker is None:
            return
        if end == "commit":
            self._commit(worker)
        else:
            worker.rollback()

    def worker_dies(self, index) -> None:
        worker = self.workers[index]
        self.dead_runs.append(worker.run_id)
        worker.die(self.observer)

    # --- the operator and the maintenance -----------------------------------------------

    @rule(
        kind=st.sampled_from(
            [
                "time passes",
                "leases run out",
                "sweep",
                "release run",
                "requeue",
                "discard",
                "retention",
                "change destination",
            ]
        ),
        data=st.data(),
    )
    def operate(self, kind, data) -> None:
        """The operator and the maintenance: one rule among the others, so that they do not
        crowd out the workers' steps."""
        if kind == "leases run out":
            self.leases_run_out(data.draw(st.integers(0, WORKERS - 1)))
        elif kind == "time passes":
            self.time_passes(data.draw(st.sampled_from([0.5, 5.0, 60.0])))
        elif kind == "sweep":
            self.sweep(data.draw(st.sampled_from(["expired", "stale", "wake", "superseded"])))
        elif kind == "release run":
            self.release_run(data.draw(st.integers(0, WORKERS + 10)))
        elif kind == "requeue":
            self.requeue_all(data.draw(st.booleans()))
        elif kind == "discard":
            self.discard_one(data.draw(st.integers(0, 1000)))
        elif kind == "retention":
            self.retention_purge()
        else:
            self.change_destination(
                data.draw(st.sampled_from(DESTINATIONS)), data.draw(st.sampled_from(CHANGES))
            )

    def _operate(self, action, after=lambda: None, may: str | None = None) -> None:
        """One operator step; ``may``: what it may do to the rows (a StepFacts flag), from its
        start until a check after its end has seen it."""
        if self.operator.busy:
            return

        def done(result: Any) -> None:
            if not isinstance(result, BaseException):
                after()

        # The step before may have ended (in this rule's settling) and committed: its
        # permission holds for this step too, before the new one's replaces it.
        self._allow()
        self.operating = may
        self._allow()
        self.operator.start(self.observer, action, done)

    def _allow(self) -> None:
        if self.operating is not None:
            setattr(self.model.step, self.operating, True)

    def leases_run_out(self, index) -> None:
        """The database's clock passes a worker's committed leases: what it records next is
        late."""
        self._begin("leases_run_out")
        tokens = [
            str(lease.lease_token)
            for lease, *_, committed in self.workers[index].held.leases
            if committed
        ]
        if not tokens:
            return
        self._operate(
            lambda: self.operator.conn.execute(
                "UPDATE webhook_delivery_all SET lease_until = now() - interval '1 second' "
                "WHERE lease_token = ANY(%s::uuid[])",
                (tokens,),
            ),
        )

    def time_passes(self, seconds) -> None:
        """Pending deliveries' due times move back, as if the clock had moved on."""
        self._begin("time_passes")
        self._operate(
            lambda: self.operator.conn.execute(
                "UPDATE webhook_delivery_all SET next_attempt_at = next_attempt_at "
                "- make_interval(secs => %s) WHERE state = 'pending'",
                (seconds,),
            ),
        )

    def sweep(self, kind) -> None:
        self._begin(f"sweep_{kind}")
        conn = self.operator.conn
        action = {
            "expired": lambda: sweeps.sweep_expired_leases(conn),
            "stale": lambda: sweeps.sweep_stale_enqueues(conn, 0.0),
            "wake": lambda: sweeps.sweep_wake_parked_heads(conn),
            "superseded": lambda: sweeps.sweep_superseded(conn),
        }[kind]
        quiet = not any(a.in_transaction for a in [self.producer, *self.workers])

        def after() -> None:
            if kind == "superseded" and quiet:
                invariants.superseded_closed(invariants.rows(self.observer), self.coalescing)

        self._operate(action, after)

    def release_run(self, pick) -> None:
        """The run-failure release, for a run whose worker died or one still sending."""
        self._begin("release_run")
        runs = self.dead_runs + [w.run_id for w in self.workers]
        run_id = runs[pick % len(runs)]
        self._operate(lambda: sweeps.release_run(self.operator.conn, run_id))

    def requeue_all(self, in_flight) -> None:
        """Requeue the dead ones, or every state it takes (rows in flight included)."""
        self._begin("requeue")
        states = requeue.REQUEUABLE_STATES if in_flight else ("dead",)

        def action() -> Any:
            return requeue.requeue(
                self.operator.conn, Cohort(), states=states, reason="model", requested_by="model"
            )

        self._operate(action, may="requeued")

    def discard_one(self, pick) -> None:
        self._begin("discard")
        if not self.model.rows:
            return
        delivery_id = sorted(self.model.rows)[pick % len(self.model.rows)]
        self._operate(
            lambda: discard.discard(
                self.operator.conn, [delivery_id], reason="model", requested_by="model"
            ),
        )

    def retention_purge(self) -> None:
        """Every terminal delivery is past the retention window; tombstones are kept."""
        self._begin("retention_purge")
        policy = retention.RetentionPolicy(retain_seconds=0.001)
        self._operate(lambda: retention.run_retention(self.operator.conn, policy), may="purged")

    def change_destination(self, destination, change) -> None:
        self._begin("change_destination")
        conn = self.operator.conn
        actions = {
            "disable": lambda: destinations.disable_destination(conn, destination, "model"),
            "enable": lambda: destinations.enable_destination(conn, destination),
            "pause": lambda: rate_limits.pause_destination(conn, destination, 0.3, "model"),
            "rotate secret": lambda: destinations.upsert_destination(
                conn, _spec(destination, secrets=SECRETS[::-1]), _settings()
            ),
            "ordering on": lambda: destinations.upsert_destination(
                conn, _spec(destination, ordering="asset"), _settings()
            ),
            "coalescing on": lambda: destinations.upsert_destination(
                conn, _spec(destination, coalescing="asset"), _settings()
            ),
        }
        # Latest wins from the moment coalescing is on; the order invariant reads only the
        # destination ordered since its first delivery (what came before was sent unordered).
        after = {"coalescing on": lambda: self.coalescing.add(destination)}.get(
            change, lambda: None
        )
        self._operate(actions[change], after)

    # --- the invariants -----------------------------------------------------------------

    @invariant()
    def protocol_holds(self) -> None:
        for actor in self._actors():
            actor.settle(self.observer)
        self._allow()
        if not self.operator.busy:
            self.operating = None
        newly = list(self.model.step.successes)
        found = invariants.rows(self.observer)
        self.model.observe(found)
        invariants.live_checks(self.observer, LEASE_SECONDS)
        invariants.in_order(found, self.ordered, newly)
        invariants.latest_wins(found, self.coalescing, newly)
        invariants.limiter(self.model, {d: LIMITS for d in DESTINATIONS})

    def teardown(self) -> None:
        if currently_in_test_context():
            note("SQL per session, in the order it ran:\n" + self.trace.render())
        for actor in self._actors():
            actor.close(self.observer)
        self.observer.close()


def _classified(
    taken: Lease, outcome: str, status: int | None, retry_after: float | None, attempted: bool
) -> Classified:
    return Classified(
        lease=taken,
        outcome=outcome,
        http_status=status,
        retry_after_seconds=retry_after,
        error=None if outcome == outcomes.SUCCESS else f"answer {status or outcome}",
        response_excerpt=None,
        finished_monotonic=time.monotonic(),
        attempted=attempted,
    )
