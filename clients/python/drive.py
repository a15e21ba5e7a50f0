"""Starts and steers sagas on a real server through the Python client generated from its
`/openapi.json` (scripts/clients.sh generates it into `generated/` and runs this program).

Every request goes through the generated client, `saga_client`; nothing here speaks HTTP
itself. Each check exits non-zero with what it expected and what it got.

    SAGA_URL=http://127.0.0.1:8080 SAGA_API_TOKEN=... PYTHONPATH=generated python drive.py
"""

import json
import os
import queue
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer

from saga_client import AuthenticatedClient
from saga_client.api.sagas import (
    get_saga,
    list_sagas,
    signal_saga,
    start_fulfil_order,
    start_payout,
    start_place_order,
)
from saga_client.api.tasks import complete_task
from saga_client.models import (
    CompleteTask,
    FulfilInput,
    FulfilOrderInputItem,
    OrderInput,
    PayoutInput,
    Saga,
    SagaDetail,
    SagaPage,
    SagaStatus,
    SignalAccepted,
    Started,
    StepStatus,
    TaskAccepted,
    TaskResult,
)
from saga_client.types import UNSET, Unset


class Mismatch(Exception):
    """An answer other than the one the API promises."""


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise Mismatch(what)


def order_id(check: str) -> str:
    # Unique per run, so that a server reused between runs keeps its sagas apart.
    return f"py-{check}-{uuid.uuid4().hex[:12]}"


def start_replays_with_the_same_key(client: AuthenticatedClient) -> None:
    """A start with an Idempotency-Key, sent twice: one saga, the second answer replayed."""
    key = f"python-{uuid.uuid4()}"
    body = OrderInput(order_id=order_id("replay"), user="python", amount=1200)
    first = start_place_order.sync_detailed(client=client, body=body, idempotency_key=key)
    expect(first.status_code == HTTPStatus.ACCEPTED,
           f"first start: expected 202, got {first.status_code} {first.content!r}")
    expect(isinstance(first.parsed, Started), f"first start: not a Started: {first.parsed!r}")
    again = start_place_order.sync_detailed(client=client, body=body, idempotency_key=key)
    expect(again.status_code == first.status_code,
           f"replay: expected {first.status_code}, got {again.status_code} {again.content!r}")
    expect(isinstance(again.parsed, Started), f"replay: not a Started: {again.parsed!r}")
    expect(again.parsed.id == first.parsed.id,
           f"replay: expected saga {first.parsed.id}, got {again.parsed.id}")
    expect(again.headers.get("Idempotent-Replayed") == "true",
           f"replay: expected Idempotent-Replayed: true, got {again.headers.get('Idempotent-Replayed')!r}")
    print(f"ok: start with Idempotency-Key replayed: saga {first.parsed.id}")


def start_waits_for_the_end(client: AuthenticatedClient) -> None:
    """`Prefer: wait=10`: the answer is the ended saga."""
    body = OrderInput(order_id=order_id("wait"), user="python", amount=800)
    answer = start_place_order.sync_detailed(client=client, body=body, prefer="wait=10")
    expect(answer.status_code == HTTPStatus.OK,
           f"start with Prefer: wait=10: expected 200, got {answer.status_code} {answer.content!r}")
    expect(isinstance(answer.parsed, Saga), f"start with Prefer: wait: not a Saga: {answer.parsed!r}")
    expect(answer.parsed.status == SagaStatus.COMPLETED,
           f"start with Prefer: wait: expected COMPLETED, got {answer.parsed.status}")
    expect(answer.headers.get("Preference-Applied") == "wait=10",
           f"expected Preference-Applied: wait=10, got {answer.headers.get('Preference-Applied')!r}")
    print(f"ok: start with Prefer: wait=10 answered COMPLETED: saga {answer.parsed.id}")


def list_by_attribute(client: AuthenticatedClient) -> None:
    """A saga found by its search attributes (`attr.user`, `attr.order_id`), not its id."""
    user = f"python-{uuid.uuid4().hex[:12]}"
    body = OrderInput(order_id=order_id("attrs"), user=user, amount=300)
    started = start_place_order.sync_detailed(client=client, body=body)
    expect(started.status_code == HTTPStatus.ACCEPTED and isinstance(started.parsed, Started),
           f"start place_order: expected 202, got {started.status_code} {started.content!r}")
    page = list_sagas.sync_detailed(client=client, attr_user=user, attr_order_id=body.order_id)
    expect(page.status_code == HTTPStatus.OK and isinstance(page.parsed, SagaPage),
           f"list by attribute: expected 200, got {page.status_code} {page.content!r}")
    ids = [str(s.id) for s in page.parsed.sagas]
    expect(ids == [str(started.parsed.id)],
           f"list by attribute: expected [{started.parsed.id}], got {ids}")
    attrs = page.parsed.sagas[0].attrs.additional_properties
    expect(attrs == {"order_id": body.order_id, "user": user},
           f"list by attribute: unexpected attrs {attrs}")
    print(f"ok: saga found by its search attributes: saga {started.parsed.id}")


def read(client: AuthenticatedClient, saga_id: str, prefer: str | Unset = UNSET) -> SagaDetail:
    answer = get_saga.sync_detailed(saga_id, client=client, prefer=prefer)
    expect(answer.status_code == HTTPStatus.OK and isinstance(answer.parsed, SagaDetail),
           f"read saga {saga_id}: expected 200, got {answer.status_code} {answer.content!r}")
    return answer.parsed


def wait_completed(client: AuthenticatedClient, saga_id) -> None:
    """Waits (long polls of 10 s, at most 30 s in all) for the saga to complete."""
    deadline = time.monotonic() + 30
    saga = read(client, saga_id, prefer="wait=10")
    while saga.status != SagaStatus.COMPLETED:
        expect(saga.status in (SagaStatus.QUEUED, SagaStatus.RUNNING),
               f"saga {saga_id}: expected it to complete, it ended {saga.status} ({saga.error})")
        expect(time.monotonic() < deadline, f"saga {saga_id}: not COMPLETED within 30 s")
        saga = read(client, saga_id, prefer="wait=10")


def stage_status(saga: SagaDetail, name: str) -> StepStatus | None:
    return next((s.status for s in saga.steps if s.name == name), None)


def signal_completes_the_approval(client: AuthenticatedClient) -> None:
    """`fulfil_order` waiting for `approval`: the signal sent, the saga completes."""
    body = FulfilInput(
        order_id=order_id("approval"),
        user="python",
        amount=2500,
        items=[FulfilOrderInputItem(sku="sku-1", qty=2)],
        needs_approval=True,
    )
    started = start_fulfil_order.sync_detailed(client=client, body=body)
    expect(started.status_code == HTTPStatus.ACCEPTED and isinstance(started.parsed, Started),
           f"start fulfil_order: expected 202, got {started.status_code} {started.content!r}")
    saga_id = str(started.parsed.id)

    deadline = time.monotonic() + 20
    saga = read(client, saga_id)
    while stage_status(saga, "await_approval") != StepStatus.WAITING:
        expect(time.monotonic() < deadline,
               f"saga {saga_id}: await_approval not WAITING within 20 s "
               f"(saga {saga.status}, stage {stage_status(saga, 'await_approval')})")
        time.sleep(0.1)
        saga = read(client, saga_id)

    sent = signal_saga.sync_detailed(saga_id, "approval", client=client,
                                     body={"approved": True, "by": "python"})
    expect(sent.status_code == HTTPStatus.ACCEPTED and isinstance(sent.parsed, SignalAccepted),
           f"signal approval: expected 202, got {sent.status_code} {sent.content!r}")

    wait_completed(client, saga_id)
    print(f"ok: signal approval sent, saga completed: saga {saga_id}")


class BankStandIn(BaseHTTPRequestHandler):
    """The bank `payout`'s `send_transfer` calls (the server was started with `--bank-url`
    pointing here): it answers 202 and keeps the task token, to complete the step later."""

    handed: "queue.Queue[tuple[str, str, dict]]" = queue.Queue()

    def do_POST(self) -> None:  # noqa: N802 (the name http.server calls)
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        token = self.headers.get("Saga-Task-Token", "")
        key = self.headers.get("Idempotency-Key", "")
        answer = json.dumps({"transfer_id": f"tr-{key[:8]}", "status": "pending"}).encode()
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        self.handed.put((token, key, body))

    def log_message(self, *args) -> None:  # quiet
        pass


def task_completion(client: AuthenticatedClient) -> None:
    """A step completed by callback (SPEC §16): this program is the bank, which answers 202
    and then completes `send_transfer` with `POST /v1/tasks/{token}/complete`."""
    host, port = os.environ["SAGA_BANK_LISTEN"].rsplit(":", 1)
    bank = HTTPServer((host, int(port)), BankStandIn)
    threading.Thread(target=bank.serve_forever, daemon=True).start()
    try:
        payout_id = order_id("payout")
        started = start_payout.sync_detailed(
            client=client, body=PayoutInput(payout_id=payout_id, merchant="python", amount=900))
        expect(started.status_code == HTTPStatus.ACCEPTED,
               f"start payout: expected 202, got {started.status_code} {started.content!r}")
        saga_id = started.parsed.id
        try:
            token, key, body = BankStandIn.handed.get(timeout=20)
        except queue.Empty:
            raise Mismatch(f"saga {saga_id}: the bank was never called") from None
        expect(body.get("payout_id") == payout_id and body.get("amount") == 900,
               f"the bank was asked for {body!r}")
        expect(token != "" and key != "", "the bank's request lacks Saga-Task-Token or Idempotency-Key")
        output = {"transfer_id": f"tr-{key[:8]}", "amount": 900}
        done = complete_task.sync_detailed(token=token, client=client, body=CompleteTask(output=output))
        expect(done.status_code == HTTPStatus.OK and isinstance(done.parsed, TaskAccepted),
               f"complete task: expected 200, got {done.status_code} {done.content!r}")
        expect(done.parsed.outcome == TaskResult.RECORDED and str(done.parsed.saga_id) == str(saga_id),
               f"complete task: expected recorded for saga {saga_id}, got {done.parsed!r}")
        again = complete_task.sync_detailed(token=token, client=client, body=CompleteTask(output=output))
        expect(again.status_code == HTTPStatus.OK and again.parsed.outcome == TaskResult.REPEATED,
               f"the same completion again: expected 200 repeated, got {again.status_code} {again.content!r}")
        forged = complete_task.sync_detailed(token="0" * len(token), client=client,
                                             body=CompleteTask(output=output))
        expect(forged.status_code == HTTPStatus.NOT_FOUND,
               f"a forged token: expected 404, got {forged.status_code}")
        wait_completed(client, saga_id)
        print(f"ok: send_transfer completed by callback with a task token: saga {saga_id}")
    finally:
        bank.shutdown()
        bank.server_close()


def main() -> int:
    client = AuthenticatedClient(
        base_url=os.environ["SAGA_URL"],
        token=os.environ["SAGA_API_TOKEN"],
        timeout=30.0,
    )
    with client:
        try:
            start_replays_with_the_same_key(client)
            start_waits_for_the_end(client)
            signal_completes_the_approval(client)
            task_completion(client)
            list_by_attribute(client)
        except Mismatch as mismatch:
            print(f"FAILED (Python client): {mismatch}", file=sys.stderr)
            return 1
    print("Python client: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
