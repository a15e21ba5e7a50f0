// Signing in: who the tab's token names (`GET /v1/whoami`), shown in the header with a way
// to sign out, and the form that asks for a token when the server wants one.

import { TOKEN_KEY, state, route } from './state.js';
import { ApiError, api } from './api.js';
import { el, fill, field, main, refreshNotice } from './ui.js';

// ---- identity -----------------------------------------------------------------------------

export async function loadMe() {
  try {
    state.me = await api('/v1/whoami');
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
      state.me = null;
      return false;
    }
    throw e;
  }
  renderWho();
  return true;
}

function renderWho() {
  const who = document.getElementById('who');
  who.replaceChildren();
  if (!state.me) return;
  const label = state.me.auth_required
    ? `${state.me.name} (${state.me.scopes.join(', ')})`
    : 'open API';
  who.append(el('span', { title: 'The token this tab uses' }, label));
  if (state.me.auth_required) {
    who.append(
      el('button', {
        type: 'button',
        onclick: () => {
          sessionStorage.removeItem(TOKEN_KEY);
          state.token = null;
          state.me = null;
          showLogin();
        },
      }, 'Sign out'),
    );
  }
}

export function showLogin(problem) {
  state.generation += 1;
  state.counts = null;
  refreshNotice(null);
  document.getElementById('counts').replaceChildren();
  renderWho();
  const input = el('input', {
    id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false',
  });
  const error = el('p', { class: 'error-text', role: 'alert', hidden: !problem }, problem || '');
  const form = el('form', {
    class: 'login',
    onsubmit: async (ev) => {
      ev.preventDefault();
      state.token = input.value.trim();
      if (await loadMe()) {
        sessionStorage.setItem(TOKEN_KEY, state.token);
        route();
      } else {
        state.token = null;
        error.textContent = 'This token is not accepted by the server.';
        error.hidden = false;
      }
    },
  },
  el('h1', {}, 'Sign in'),
  el('p', { class: 'muted' }, 'This server asks for an API token. It is kept for this tab only.'),
  field('token', 'API token', input),
  error,
  el('div', {}, el('button', { class: 'primary', type: 'submit' }, 'Sign in')));
  fill(main(), form);
  input.focus();
}
