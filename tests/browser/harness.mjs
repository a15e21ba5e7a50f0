// Shared by the browser tests and the screenshot script: a real `example-sagas serve` on a
// fresh SQLite database, sagas started through its HTTP API, and Debian's Chromium driven by
// playwright-core. Nothing is faked: what the browser shows comes from the real server.
import { spawn } from 'node:child_process';
import { createServer, connect } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '..', '..');

/** The tokens of a server started with `tokens: true`. */
export const TOKENS = {
  admin: 'console-admin-7f3a9c',
  reader: 'console-reader-2b8e41',
};

/** The example-sagas binary: SAGA_BIN, else the debug build of this checkout. */
function binary() {
  const bin = process.env.SAGA_BIN || join(root, 'target', 'debug', 'example-sagas');
  if (!existsSync(bin)) {
    throw new Error(`${bin} is missing: run \`cargo build -p example-sagas\` first`);
  }
  return bin;
}

/** Starts a server; `tokens` asks for bearer tokens (an admin one and a read-only one), `args`
 * are more flags for `serve`. */
export async function startServer({ tokens = false, args: more = [] } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'saga-console-'));
  const args = [
    'serve', '--listen', '127.0.0.1:0',
    '--database-url', `sqlite://${join(dir, 'saga.db')}`,
    '--shop-database-url', `sqlite://${join(dir, 'shop.db')}`,
  ];
  if (tokens) {
    const file = join(dir, 'tokens');
    writeFileSync(file, `ops admin ${TOKENS.admin}\nviewer read ${TOKENS.reader}\n`);
    args.push('--api-tokens-file', file);
  }
  args.push(...more);
  const child = spawn(binary(), args, {
    env: { ...process.env, RUST_LOG: 'error' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const base = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error('the server did not start')), 30_000);
    child.on('exit', (code) => fail(new Error(`the server exited with ${code}`)));
    createInterface({ input: child.stdout }).on('line', (line) => {
      const m = line.match(/^listening on (http:\/\/\S+)/);
      if (m) {
        clearTimeout(timer);
        ok(m[1]);
      }
    });
  });
  const token = tokens ? TOKENS.admin : null;
  return {
    base,
    dir,
    /** Calls the API as the admin. */
    async api(path, { method = 'GET', body, headers = {} } = {}) {
      const h = { 'content-type': 'application/json', ...headers };
      if (token) h.authorization = `Bearer ${token}`;
      const r = await fetch(base + path, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body) });
      const text = await r.text();
      if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
      return text ? JSON.parse(text) : null;
    },
    async stop() {
      child.kill('SIGKILL');
      await new Promise((ok) => (child.exitCode !== null ? ok() : child.on('exit', ok)));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Starts a saga and returns its id. */
export async function start(server, name, input) {
  return (await server.api(`/v1/sagas/${name}`, { method: 'POST', body: input })).id;
}

/** Polls the saga until `until(saga)` holds. */
export async function waitFor(server, id, until, timeout = 30_000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const saga = await server.api(`/v1/sagas/${id}`);
    if (until(saga)) return saga;
    if (Date.now() > deadline) throw new Error(`saga ${id} never got there: ${JSON.stringify(saga.status)}`);
    await new Promise((ok) => setTimeout(ok, 50));
  }
}

/** Debian's Chromium, headless, on a fresh profile, kept off the network it cannot reach. */
export async function launchBrowser() {
  const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
  if (!existsSync(executablePath)) {
    throw new Error(`${executablePath} is missing: install Debian's chromium (scripts/test.sh does)`);
  }
  return chromium.launch({
    executablePath,
    headless: true,
    args: [
      '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
}

/** A page of `browser` on the console's `hash`, signed in with `token`; the page errors it
 * throws are collected in `errors`. */
export async function signedIn(browser, server, hash, token, options = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, ...options });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${server.base}/ui/${hash}`);
  await page.getByLabel('API token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  return { page, context, errors };
}

/** A free loopback port. */
async function freePort() {
  const server = createServer();
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
  const { port } = server.address();
  await new Promise((ok) => server.close(ok));
  return port;
}

/** A real `nats-server -js` on its own port and store (SAGA_TEST_NATS_SERVER, else the one on
 * the PATH), with `publish` speaking the NATS protocol itself: one message, flushed by a PING
 * answered PONG, so that it is in JetStream before this returns. */
export async function startNats() {
  const dir = mkdtempSync(join(tmpdir(), 'saga-nats-'));
  const port = await freePort();
  const child = spawn(process.env.SAGA_TEST_NATS_SERVER || 'nats-server',
    ['-a', '127.0.0.1', '-p', String(port), '-js', '-sd', dir], { stdio: 'ignore' });
  const exited = new Promise((ok) => child.on('exit', ok));
  let failed = null;
  child.on('error', (e) => { failed = e; });
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (failed) throw new Error(`nats-server did not start: ${failed.message}`);
    const up = await new Promise((ok) => {
      const socket = connect(port, '127.0.0.1', () => { socket.destroy(); ok(true); });
      socket.on('error', () => ok(false));
    });
    if (up) break;
    if (Date.now() > deadline) throw new Error(`nats-server did not listen on port ${port}`);
    await new Promise((ok) => setTimeout(ok, 50));
  }
  return {
    url: `nats://127.0.0.1:${port}`,
    async publish(subject, body) {
      const bytes = Buffer.from(body);
      await new Promise((ok, fail) => {
        const socket = connect(port, '127.0.0.1');
        let seen = '';
        socket.on('data', (chunk) => {
          seen += chunk.toString();
          if (seen.includes('-ERR')) fail(new Error(`nats: ${seen}`));
          else if (seen.includes('PONG')) { socket.end(); ok(); }
        });
        socket.on('error', fail);
        socket.write('CONNECT {"verbose":false,"pedantic":false}\r\n');
        socket.write(`PUB ${subject} ${bytes.length}\r\n`);
        socket.write(bytes);
        socket.write('\r\nPING\r\n');
      });
    },
    async stop() {
      if (!failed && child.exitCode === null) {
        child.kill('SIGKILL');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
