// The saga console: plain ES modules, no build step, no dependency. This one routes and wires
// the page; below it, list.js and saga.js draw the pages, actions.js the action dialogs,
// bulk.js the bulk jobs' pages, limits.js the limits of flow control and their changes,
// schedules.js the schedules with their runs, poll.js keeps a page current, login.js signs in, ui.js builds and patches the page, api.js
// talks to the server and state.js holds what they share; no module imports one that imports
// it. The console reads and steers sagas through the same HTTP API as any client, with the
// user's token (kept for this tab only, in sessionStorage, and sent as a bearer header: never
// in a URL or a cookie).
//
// Live updates are a cheap poll: a saga's page reads the saga every 2 seconds and its attempts,
// events and deliveries only when it changed; the list reads its page and the (server-cached)
// counts every 5. Nothing is polled while the tab is hidden or once a saga is finished. What
// did not change is not drawn again, and what is drawn again is patched in place (the same
// nodes stay), so that the keyboard's focus, scroll positions and a screen reader's place
// survive an update.

import { state, setRouter } from './state.js';
import { ApiError, describe } from './api.js';
import { el, fill, main, refreshNotice } from './ui.js';
import { loadMe, showLogin } from './login.js';
import { renderList } from './list.js';
import { renderSaga } from './saga.js';
import { renderBulk, renderBulkList } from './bulk.js';
import { renderLimits } from './limits.js';
import { renderSchedule, renderSchedules } from './schedules.js';

// ---- routing ------------------------------------------------------------------------------

async function route() {
  state.generation += 1;
  const generation = state.generation;
  state.refresh = null;
  refreshNotice(null);
  if (!state.me) {
    try {
      if (!(await loadMe())) {
        if (generation === state.generation) showLogin(state.token ? 'The token was refused.' : undefined);
        return undefined;
      }
    } catch (e) {
      if (generation === state.generation) {
        fill(main(), el('p', { class: 'notice', role: 'alert' }, `The server cannot be reached: ${e.message}`));
      }
      return undefined;
    }
  }
  if (generation !== state.generation) return undefined;
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  for (const link of document.querySelectorAll('.pages a')) {
    link.setAttribute('aria-current', link.getAttribute('href') === `#${path}` ? 'page' : 'false');
  }
  const sagaMatch = path.match(/^\/sagas\/([0-9a-fA-F-]{36})$/);
  try {
    const bulkMatch = path.match(/^\/bulk\/([0-9a-fA-F-]{36})$/);
    if (sagaMatch) await renderSaga(sagaMatch[1].toLowerCase());
    else if (bulkMatch) await renderBulk(bulkMatch[1].toLowerCase());
    else if (path === '/bulk') await renderBulkList();
    else if (path === '/limits') await renderLimits();
    else if (path === '/schedules') await renderSchedules();
    else if (path.startsWith('/schedules/')) await renderSchedule(decodeURIComponent(path.slice('/schedules/'.length)));
    else await renderList(new URLSearchParams(query || ''));
  } catch (e) {
    // A page left while it loaded says nothing over the one shown since.
    if (generation !== state.generation) return undefined;
    if (e instanceof ApiError && e.status === 401) return showLogin('The token was refused.');
    const text = e instanceof ApiError && e.status === 404 && sagaMatch
      ? `There is no saga ${sagaMatch[1]} on this server (${e.describe()}).`
      : describe(e);
    fill(main(), el('p', { class: 'notice', role: 'alert' }, text),
      el('p', {}, el('a', { href: '#/' }, '← All sagas')));
  }
  return undefined;
}

setRouter(route);
window.addEventListener('hashchange', () => {
  route();
  main().focus({ preventScroll: true });
});
route();
