// Shared by both tiers' status pages: the token, authenticated fetches,
// polling, and small DOM helpers. Data from the server is only ever set
// as text (never parsed as HTML).
'use strict';

const IG = (() => {
  const KEY = 'infergate-status-token';
  const EVERY = 2000; // ms between refreshes

  // The token comes in the URL fragment (never sent to the server), moves
  // to sessionStorage and leaves the address bar.
  function takeToken() {
    const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (m) {
      sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
      history.replaceState(null, '', location.pathname + location.search);
    }
    return sessionStorage.getItem(KEY) || '';
  }
  let token = takeToken();

  class AuthError extends Error {}

  // get fetches JSON from the tier's API with the token.
  async function get(path) {
    return call('GET', path);
  }

  async function call(method, path, body) {
    const headers = {};
    if (token) headers.Authorization = 'Bearer ' + token;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const r = await fetch(path, {method, headers, cache: 'no-store', credentials: 'omit',
      body: body === undefined ? undefined : JSON.stringify(body)});
    if (r.status === 401) throw new AuthError('The token was refused.');
    const data = await r.json().catch(() => null);
    if (!r.ok) {
      throw new Error((data && data.error && data.error.message) || (r.status + ' ' + r.statusText));
    }
    return data;
  }

  // el builds an element: props are attributes, except class, text,
  // dataset, style (an object) and on* (listeners); children are nodes
  // or text.
  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k === 'dataset') Object.assign(e.dataset, v);
      else if (k === 'style') Object.assign(e.style, v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const k of kids.flat(Infinity)) {
      if (k === null || k === undefined || k === false) continue;
      e.append(k instanceof Node ? k : String(k));
    }
    return e;
  }

  // card is a titled section of the page; its h2 holds title and note.
  function card(id, title, ...kids) {
    const note = el('small');
    const s = el('section', {class: 'card', id}, el('h2', null, title, note), ...kids);
    s.note = note;
    return s;
  }

  // table is a table whose body each update replaces. columns: {label,
  // cell(row) -> node|text, num (right-aligned), wrap}. opts.row(row) gives
  // the row's props (dataset, class, onclick).
  function table(columns, opts) {
    opts = opts || {};
    const body = el('tbody');
    const t = el('table', null,
      el('thead', null, el('tr', null, columns.map(c => el('th', {class: c.num ? 'num' : null}, c.label)))), body);
    t.update = rows => {
      const trs = rows.map(r => el('tr', opts.row ? opts.row(r) : null,
        columns.map(c => el('td', {class: c.num ? 'num' : (c.wrap ? 'wrap' : null)}, c.cell(r)))));
      if (!trs.length) {
        trs.push(el('tr', null, el('td', {colspan: columns.length, class: 'empty'}, opts.empty || 'none')));
      }
      body.replaceChildren(...trs);
    };
    return t;
  }

  // pager pages a server-side list: onChange(offset) when moved.
  function pager(onChange) {
    const info = el('span', {class: 'muted'});
    let offset = 0, limit = 50, total = 0;
    const prev = el('button', {type: 'button', onclick: () => onChange(Math.max(0, offset - limit))}, '‹ prev');
    const next = el('button', {type: 'button', onclick: () => onChange(offset + limit)}, 'next ›');
    const p = el('span', {class: 'pager'}, prev, info, next);
    p.set = (o, l, t) => {
      offset = o; limit = l; total = t;
      info.textContent = t === 0 ? '0 of 0' : `${o + 1}–${Math.min(o + l, t)} of ${t}`;
      prev.disabled = o === 0;
      next.disabled = o + l >= t;
    };
    return p;
  }

  // debounce delays fn until calls stop for ms.
  function debounce(fn, ms) {
    let t;
    return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
  }

  // Formatting.
  const fmt = {
    num: v => (v === null || v === undefined) ? '–' : Number(v).toLocaleString('en'),
    pct: v => (v === null || v === undefined) ? '–' : (100 * v).toFixed(1) + '%',
    ms: v => {
      if (v === null || v === undefined || v < 0) return 'never';
      if (v < 1000) return Math.round(v) + ' ms';
      if (v < 120000) return (v / 1000).toFixed(1) + ' s';
      return Math.round(v / 60000) + ' min';
    },
    ago: iso => {
      if (!iso) return 'never';
      const d = Date.now() - Date.parse(iso);
      return d < 0 ? 'now' : fmt.ms(d) + ' ago';
    },
    time: iso => iso ? new Date(iso).toLocaleTimeString('en-GB') : '–',
    money: v => (v === null || v === undefined) ? '–' : '$' + Number(v).toFixed(4),
    list: a => (a && a.length) ? a.join(', ') : '–',
  };

  // bar draws a fraction in [0,1], coloured by thresholds.
  function bar(v, warn, bad) {
    if (v === null || v === undefined) return el('span', {class: 'muted'}, '–');
    const cls = v >= (bad ?? 0.95) ? 'bad' : v >= (warn ?? 0.8) ? 'warn' : null;
    return el('span', null, el('span', {class: 'bar'}, el('i', {class: cls, style: {width: Math.min(100, 100 * v) + '%'}})), fmt.pct(v));
  }

  // tile is one number with its label.
  function tile(label, value, cls) {
    return el('div', {class: 'tile'}, el('b', {class: cls}, value), el('span', null, label));
  }

  // badge is a word in a pill, coloured by cls.
  function badge(text, cls) {
    return el('span', {class: 'badge ' + (cls || '')}, text);
  }

  const live = () => document.getElementById('live');

  function setLive(ok, msg) {
    const b = live();
    b.className = 'badge ' + (ok ? 'ok' : 'bad');
    b.textContent = ok ? 'live · ' + new Date().toLocaleTimeString('en-GB') : 'error: ' + msg;
  }

  function showLogin(msg) {
    const login = document.getElementById('login');
    document.getElementById('login-msg').textContent = msg;
    login.hidden = false;
    document.getElementById('main').hidden = true;
    live().className = 'badge warn';
    live().textContent = 'needs a token';
  }

  // start runs refresh now and every EVERY ms while the tab is visible;
  // one refresh at a time (a request for another while one runs is
  // merged into one more after it). It returns the function that asks
  // for a refresh now.
  function start(refresh) {
    let timer = null, running = false, again = false;
    async function tick() {
      clearTimeout(timer);
      if (running) { again = true; return; }
      running = true;
      try {
        if (!document.hidden) {
          await refresh();
          setLive(true);
        }
      } catch (e) {
        if (e instanceof AuthError) { running = false; showLogin(e.message + ' Paste a valid one.'); return; }
        setLive(false, e.message);
      }
      running = false;
      if (again) { again = false; tick(); return; }
      timer = setTimeout(tick, EVERY);
    }
    document.getElementById('login-form').addEventListener('submit', ev => {
      ev.preventDefault();
      token = document.getElementById('login-token').value.trim();
      sessionStorage.setItem(KEY, token);
      document.getElementById('login').hidden = true;
      document.getElementById('main').hidden = false;
      tick();
    });
    document.addEventListener('visibilitychange', () => { if (!document.hidden) tick(); });
    tick();
    return tick;
  }

  // setScope writes the header's second line.
  function setScope(text) { document.getElementById('scope').textContent = text; }

  return {get, call, el, card, table, pager, debounce, fmt, bar, tile, badge, start, setScope, AuthError};
})();
