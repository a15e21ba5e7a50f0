// Starts and steers sagas on a real server through the TypeScript client generated from its
// `/openapi.json` by @hey-api/openapi-ts (scripts/clients.sh generates it into `generated/`,
// type-checks this program against it and runs it with tsx).
//
// Every request goes through the generated client; nothing here speaks HTTP itself. Each check
// exits non-zero with what it expected and what it got.
//
//     SAGA_URL=http://127.0.0.1:8080 SAGA_API_TOKEN=... npx tsx drive.ts

import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';

import { client } from './generated/client.gen.js';
import {
  completeTask,
  getSaga,
  listSagas,
  signalSaga,
  startFulfilOrder,
  startPayout,
  startPlaceOrder,
} from './generated/sdk.gen.js';
import type { Saga, SagaDetail, SagaPage, Started, StepStatus, TaskAccepted } from './generated/types.gen.js';

/** An answer other than the one the API promises. */
class Mismatch extends Error {}

function expect(condition: boolean, what: string): asserts condition {
  if (!condition) {
    throw new Mismatch(what);
  }
}

/** Unique per run, so that a server reused between runs keeps its sagas apart. */
function orderId(check: string): string {
  return `ts-${check}-${randomUUID().slice(0, 12)}`;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A start with an Idempotency-Key, sent twice: one saga, the second answer replayed. */
async function startReplaysWithTheSameKey(): Promise<void> {
  const key = `typescript-${randomUUID()}`;
  const body = { order_id: orderId('replay'), user: 'typescript', amount: 1200 };
  const first = await startPlaceOrder({ body, headers: { 'Idempotency-Key': key } });
  expect(first.response.status === 202, `first start: expected 202, got ${first.response.status} ${JSON.stringify(first.error)}`);
  const started = first.data as Started;
  const again = await startPlaceOrder({ body, headers: { 'Idempotency-Key': key } });
  expect(again.response.status === 202, `replay: expected 202, got ${again.response.status} ${JSON.stringify(again.error)}`);
  const replayed = again.data as Started;
  expect(replayed.id === started.id, `replay: expected saga ${started.id}, got ${replayed.id}`);
  const header = again.response.headers.get('Idempotent-Replayed');
  expect(header === 'true', `replay: expected Idempotent-Replayed: true, got ${header}`);
  console.log(`ok: start with Idempotency-Key replayed: saga ${started.id}`);
}

/** `Prefer: wait=10`: the answer is the ended saga. */
async function startWaitsForTheEnd(): Promise<void> {
  const body = { order_id: orderId('wait'), user: 'typescript', amount: 800 };
  const answer = await startPlaceOrder({ body, headers: { Prefer: 'wait=10' } });
  expect(answer.response.status === 200, `start with Prefer: wait=10: expected 200, got ${answer.response.status} ${JSON.stringify(answer.error ?? answer.data)}`);
  const saga = answer.data as Saga;
  expect(saga.status === 'COMPLETED', `start with Prefer: wait: expected COMPLETED, got ${saga.status}`);
  const applied = answer.response.headers.get('Preference-Applied');
  expect(applied === 'wait=10', `expected Preference-Applied: wait=10, got ${applied}`);
  console.log(`ok: start with Prefer: wait=10 answered COMPLETED: saga ${saga.id}`);
}

async function read(id: string, prefer?: string): Promise<SagaDetail> {
  const answer = await getSaga({ path: { saga: id }, headers: prefer ? { Prefer: prefer } : undefined });
  expect(answer.response.status === 200 && answer.data !== undefined, `read saga ${id}: expected 200, got ${answer.response.status} ${JSON.stringify(answer.error)}`);
  return answer.data;
}

/** Waits (long polls of 10 s, at most 30 s in all) for the saga to complete. */
async function waitCompleted(id: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  let saga = await read(id, 'wait=10');
  while (saga.status !== 'COMPLETED') {
    expect(saga.status === 'QUEUED' || saga.status === 'RUNNING', `saga ${id}: expected it to complete, it ended ${saga.status} (${saga.error})`);
    expect(Date.now() < deadline, `saga ${id}: not COMPLETED within 30 s`);
    saga = await read(id, 'wait=10');
  }
}

function stageStatus(saga: SagaDetail, name: string): StepStatus | undefined {
  return saga.steps.find((step) => step.name === name)?.status;
}

/** `fulfil_order` waiting for `approval`: the signal sent, the saga completes. */
async function signalCompletesTheApproval(): Promise<void> {
  const started = await startFulfilOrder({
    body: {
      order_id: orderId('approval'),
      user: 'typescript',
      amount: 2500,
      items: [{ sku: 'sku-1', qty: 2 }],
      needs_approval: true,
    },
  });
  expect(started.response.status === 202, `start fulfil_order: expected 202, got ${started.response.status} ${JSON.stringify(started.error)}`);
  const id = (started.data as Started).id;

  const deadline = Date.now() + 20_000;
  let saga = await read(id);
  while (stageStatus(saga, 'await_approval') !== 'WAITING') {
    expect(Date.now() < deadline, `saga ${id}: await_approval not WAITING within 20 s (saga ${saga.status}, stage ${stageStatus(saga, 'await_approval')})`);
    await sleep(100);
    saga = await read(id);
  }

  const sent = await signalSaga({
    path: { saga: id, signal: 'approval' },
    body: { approved: true, by: 'typescript' },
  });
  expect(sent.response.status === 202 && sent.data !== undefined, `signal approval: expected 202, got ${sent.response.status} ${JSON.stringify(sent.error)}`);

  await waitCompleted(id);
  console.log(`ok: signal approval sent, saga completed: saga ${id}`);
}

/** What the stand-in bank was handed: the task token, the idempotency key and the body. */
interface Handed {
  token: string;
  key: string;
  body: { payout_id?: string; amount?: number };
}

/**
 * A step completed by callback (SPEC §16): this program is the bank `payout`'s send_transfer
 * calls (the server was started with `--bank-url` pointing here). It answers 202 and then
 * completes the step with `POST /v1/tasks/{token}/complete` through the generated client.
 */
async function taskCompletion(): Promise<void> {
  const [host, port] = (process.env.SAGA_BANK_LISTEN ?? '').split(':');
  let handOver: (handed: Handed) => void = () => {};
  const handed = new Promise<Handed>((resolve) => {
    handOver = resolve;
  });
  const bank = createServer((req, res) => {
    let text = '';
    req.on('data', (chunk) => (text += chunk));
    req.on('end', () => {
      const key = String(req.headers['idempotency-key'] ?? '');
      res.writeHead(202, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ transfer_id: `tr-${key.slice(0, 8)}`, status: 'pending' }));
      handOver({ token: String(req.headers['saga-task-token'] ?? ''), key, body: JSON.parse(text || '{}') });
    });
  });
  await new Promise<void>((resolve) => bank.listen(Number(port), host, resolve));
  try {
    const payoutId = orderId('payout');
    const started = await startPayout({ body: { payout_id: payoutId, merchant: 'typescript', amount: 900 } });
    expect(started.response.status === 202, `start payout: expected 202, got ${started.response.status} ${JSON.stringify(started.error)}`);
    const id = (started.data as Started).id;
    const timeout = sleep(20_000).then(() => undefined);
    const got = await Promise.race([handed, timeout]);
    expect(got !== undefined, `saga ${id}: the bank was never called`);
    expect(got.body.payout_id === payoutId && got.body.amount === 900, `the bank was asked for ${JSON.stringify(got.body)}`);
    expect(got.token !== '' && got.key !== '', 'the bank\'s request lacks Saga-Task-Token or Idempotency-Key');
    const output = { transfer_id: `tr-${got.key.slice(0, 8)}`, amount: 900 };
    const done = await completeTask({ path: { token: got.token }, body: { output } });
    expect(done.response.status === 200 && done.data !== undefined, `complete task: expected 200, got ${done.response.status} ${JSON.stringify(done.error)}`);
    const accepted: TaskAccepted = done.data;
    expect(accepted.outcome === 'recorded' && accepted.saga_id === id, `complete task: expected recorded for saga ${id}, got ${JSON.stringify(accepted)}`);
    const again = await completeTask({ path: { token: got.token }, body: { output } });
    expect(again.response.status === 200 && again.data?.outcome === 'repeated', `the same completion again: expected 200 repeated, got ${again.response.status} ${JSON.stringify(again.data ?? again.error)}`);
    const forged = await completeTask({ path: { token: '0'.repeat(got.token.length) }, body: { output } });
    expect(forged.response.status === 404, `a forged token: expected 404, got ${forged.response.status}`);
    await waitCompleted(id);
    console.log(`ok: send_transfer completed by callback with a task token: saga ${id}`);
  } finally {
    await new Promise<void>((resolve) => bank.close(() => resolve()));
  }
}

/** A saga found by its search attributes (`attr.user`, `attr.order_id`), not its id. */
async function listByAttribute(): Promise<void> {
  const user = `typescript-${randomUUID().slice(0, 12)}`;
  const body = { order_id: orderId('attrs'), user, amount: 300 };
  const started = await startPlaceOrder({ body });
  expect(started.response.status === 202, `start place_order: expected 202, got ${started.response.status}`);
  const id = (started.data as Started).id;
  const page = await listSagas({ query: { 'attr.user': user, 'attr.order_id': body.order_id } });
  expect(page.response.status === 200, `list by attribute: expected 200, got ${page.response.status} ${JSON.stringify(page.error)}`);
  const sagas = (page.data as SagaPage).sagas;
  const ids = sagas.map((s) => s.id);
  expect(ids.length === 1 && ids[0] === id, `list by attribute: expected [${id}], got ${JSON.stringify(ids)}`);
  const attrs = sagas[0].attrs;
  expect(attrs.user === user && attrs.order_id === body.order_id, `list by attribute: unexpected attrs ${JSON.stringify(attrs)}`);
  console.log(`ok: saga found by its search attributes: saga ${id}`);
}

async function main(): Promise<number> {
  const baseUrl = process.env.SAGA_URL;
  const token = process.env.SAGA_API_TOKEN;
  if (!baseUrl || !token) {
    console.error('set SAGA_URL and SAGA_API_TOKEN');
    return 2;
  }
  client.setConfig({ baseUrl, auth: token });
  try {
    await startReplaysWithTheSameKey();
    await startWaitsForTheEnd();
    await signalCompletesTheApproval();
    await taskCompletion();
    await listByAttribute();
  } catch (e) {
    if (e instanceof Mismatch) {
      console.error(`FAILED (TypeScript client): ${e.message}`);
      return 1;
    }
    throw e;
  }
  console.log('TypeScript client: every check passed');
  return 0;
}

process.exitCode = await main();
