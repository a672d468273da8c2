// Tier 1's status page: pools and GPU classes, the pods (filtered and
// paged by the server, so 1,000 pods cost one page), the last routing
// decisions with their score breakdown, the replica mesh and the queue.
'use strict';

(() => {
  const {el, card, table, pager, fmt, bar, tile, badge} = IG;
  const API = '/status/api/';
  const stateClass = {ready: 'ok', saturated: 'warn', stale: 'warn', unready: 'bad', not_scraped: 'bad'};

  // What the operator chose; kept across refreshes.
  const view = {q: '', pool: '', gpu: '', state: '', offset: 0, limit: 50, open: new Set()};
  let refreshNow = () => {};
  const go = changes => { Object.assign(view, changes); refreshNow(); };

  const tiles = el('div', {class: 'tiles', id: 'tiles'});

  const groupCols = first => [
    {label: first, cell: g => g.name},
    {label: 'pods', num: true, cell: g => g.pods},
    {label: 'ready', num: true, cell: g => el('span', {class: 'ok'}, g.states.ready || 0)},
    {label: 'saturated', num: true, cell: g => g.states.saturated || 0},
    {label: 'problems', num: true, cell: g => {
      const n = g.pods - (g.states.ready || 0) - (g.states.saturated || 0);
      return el('span', {class: n ? 'bad' : 'muted'}, n);
    }},
    {label: 'running', num: true, cell: g => fmt.num(g.running)},
    {label: 'waiting (engines)', num: true, cell: g => fmt.num(g.waiting)},
    {label: 'in flight', num: true, cell: g => fmt.num(g.in_flight)},
    {label: 'KV use (mean)', cell: g => bar(g.kv_usage_avg)},
  ];
  const pools = table([
    ...groupCols('pool'),
    {label: 'model', cell: g => g.model},
    {label: 'queued', num: true, cell: g => g.queue ? g.queue.waiting : 0},
    {label: 'oldest wait', num: true, cell: g => g.queue && g.queue.waiting ? fmt.ms(g.queue.oldest_wait_ms) : '–'},
  ], {row: g => ({class: 'clickable' + (view.pool === g.name ? ' selected' : ''), dataset: {pool: g.name},
    title: 'show this pool\'s pods', onclick: () => go({pool: view.pool === g.name ? '' : g.name, offset: 0})})});
  const gpus = table(groupCols('GPU'), {row: g => ({class: 'clickable' + (view.gpu === g.name ? ' selected' : ''),
    dataset: {gpu: g.name}, onclick: () => go({gpu: view.gpu === g.name ? '' : (g.name === 'unknown' ? '' : g.name), offset: 0})})});

  // Pods: the filter and paging run on the server.
  const search = el('input', {type: 'search', id: 'pod-filter', placeholder: 'filter: name, address, model, GPU, error…',
    oninput: IG.debounce(e => go({q: e.target.value, offset: 0}), 250)});
  const stateSel = el('select', {id: 'pod-state', onchange: e => go({state: e.target.value, offset: 0})},
    el('option', {value: ''}, 'any state'), el('option', {value: 'problem'}, 'problems only'),
    ['ready', 'saturated', 'stale', 'unready', 'not_scraped'].map(s => el('option', {value: s}, s)));
  const chips = el('span', {class: 'muted'});
  const podPager = pager(offset => go({offset}));
  const pods = table([
    {label: 'pod', cell: p => el('span', {title: p.address}, p.name)},
    {label: 'state', cell: p => badge(p.state.replace('_', ' '), stateClass[p.state])},
    {label: 'pool', cell: p => p.pool},
    {label: 'engine', cell: p => p.engine || '–'},
    {label: 'GPU', cell: p => (p.gpu || '–') + (p.gpus > 1 ? ' ×' + p.gpus : '')},
    {label: 'running', num: true, cell: p => p.running},
    {label: 'waiting', num: true, cell: p => p.waiting},
    {label: 'KV', cell: p => bar(p.kv_usage)},
    {label: 'in flight', num: true, cell: p => p.in_flight},
    {label: 'metrics age', num: true, cell: p => el('span', {class: p.state === 'stale' ? 'warn' : null,
      title: p.idle ? 'idle: scraped on the slower schedule' : null}, fmt.ms(p.metrics_age_ms) + (p.idle ? ' (idle)' : ''))},
    {label: 'models / adapters', wrap: true, cell: p => {
      const act = p.active_adapters.length ? ' · loaded: ' + p.active_adapters.join(', ') : '';
      return fmt.list(p.models) + act;
    }},
    {label: 'problem', wrap: true, cell: p => el('span', {class: 'bad'},
      p.connect_failed ? 'connection refused' + (p.scrape_error ? '; ' : '') : '', p.scrape_error || '')},
  ], {row: p => ({dataset: {pod: p.name, state: p.state}}), empty: 'no pod matches'});

  // Decisions: newest first; a row opens to the score breakdown.
  const decisions = el('div', {id: 'decision-list'});
  function decisionView(d) {
    const open = view.open.has(d.seq);
    const cls = d.outcome === 'dispatched' ? (d.served_by !== undefined ? 'warn' : 'ok') : 'bad';
    const det = el('details', {open, dataset: {seq: d.seq, outcome: d.outcome},
      ontoggle: e => e.target.open ? view.open.add(d.seq) : view.open.delete(d.seq)},
    el('summary', null, el('span', {class: 'muted'}, fmt.time(d.at)), ' ', badge(d.outcome, cls), ' ',
      el('b', null, d.model), ' → ', d.pod || d.code || '–', ' ', el('span', {class: 'muted'}, '· ' + d.reason)));
    if (open) det.append(decisionDetail(d));
    else det.addEventListener('toggle', () => { if (det.open && det.childNodes.length < 2) det.append(decisionDetail(d)); }, {once: true});
    return det;
  }
  function decisionDetail(d) {
    const cols = [
      {label: 'rank', num: true, cell: c => c.rank || '–'},
      {label: 'pod', cell: c => c.pod},
      ...d.scorers.map(s => ({label: `${s.name} ×${s.weight}`, num: true, cell: c => (c.scores[s.name] ?? 0).toFixed(3)})),
      {label: 'total', num: true, cell: c => el('b', null, c.total.toFixed(3))},
    ];
    const t = table(cols, {empty: 'no candidate'});
    t.update(d.candidates);
    const ex = Object.entries(d.excluded).map(([k, n]) => `${n} ${k.replaceAll('_', ' ')}`).join(', ');
    return el('div', null,
      el('p', null, `request ${d.request_id || '–'} · pool ${d.pool}${d.adapter ? ' · adapter ' + d.adapter : ''} · ` +
        `${d.candidates_total} candidates of ${d.pool_pods} pods · ${d.scheduling_cycles} scheduling cycles` +
        (d.queued ? ` · queued ${fmt.ms(d.waited_ms)}` : '')),
      t,
      d.candidates_total > d.candidates.length ? el('p', {class: 'muted'}, `showing the ranked ${d.candidates.length} of ${d.candidates_total} candidates`) : null,
      ex ? el('p', null, 'filtered out: ' + ex + (d.excluded_pods.length ? ' (' + d.excluded_pods.map(e => `${e.pod}: ${e.reason.replaceAll('_', ' ')}`).join('; ') + ')' : '')) : null);
  }

  // Mesh and queue.
  const peers = table([
    {label: 'peer address', cell: p => p.address},
    {label: 'stream', cell: p => p.connected ? badge('connected', 'ok') : badge('down', 'bad')},
  ], {empty: 'no peers discovered'});
  const replicas = table([
    {label: 'replica', cell: r => r.id},
    {label: 'remote', cell: r => r.remote},
    {label: 'last heard', num: true, cell: r => fmt.ms(r.last_heard_ms) + ' ago'},
    {label: 'stream', cell: r => r.live ? badge('open', 'ok') : badge('closed', 'warn')},
    {label: 'counting', cell: r => r.counting ? 'yes' : 'no'},
    {label: 'pods', num: true, cell: r => r.pods},
  ], {empty: 'no replica streams to this one'});
  const meshInfo = el('p', {class: 'muted'});
  const queue = table([
    {label: 'pool', cell: q => q.pool},
    {label: 'waiting', num: true, cell: q => el('span', {class: q.waiting ? 'warn' : null}, q.waiting)},
    {label: 'oldest wait', num: true, cell: q => q.waiting ? fmt.ms(q.oldest_wait_ms) : '–'},
    {label: 'by priority', cell: q => Object.entries(q.by_priority).map(([p, n]) => `${p}: ${n}`).join(', ') || '–'},
    {label: 'max', num: true, cell: q => q.max_len},
  ]);

  const cards = {
    pools: card('pools', 'Pools', pools),
    gpus: card('gpus', 'GPU classes', gpus),
    pods: card('pods', 'Pods', el('div', {class: 'controls'}, search, stateSel, chips, podPager), pods),
    decisions: card('decisions', 'Recent routing decisions', decisions),
    queue: card('queue', 'Admission queue', queue),
    mesh: card('mesh', 'Replica mesh', meshInfo, peers, replicas),
  };
  document.getElementById('main').append(tiles, ...Object.values(cards));

  async function refresh() {
    const q = new URLSearchParams({offset: view.offset, limit: view.limit});
    for (const k of ['q', 'pool', 'gpu', 'state']) if (view[k]) q.set(k, view[k]);
    const [sum, pp, dec] = await Promise.all([IG.get(API + 'summary'), IG.get(API + 'pods?' + q), IG.get(API + 'decisions?limit=25')]);
    if (pp.offset >= pp.total && pp.total > 0) { view.offset = Math.floor((pp.total - 1) / view.limit) * view.limit; return refresh(); }

    IG.setScope(`cluster ${sum.cluster} · region ${sum.region}`);
    const t = sum.total, problems = t.pods - (t.states.ready || 0) - (t.states.saturated || 0);
    const queued = sum.pools.reduce((n, p) => n + (p.queue ? p.queue.waiting : 0), 0);
    tiles.replaceChildren(tile('pods', t.pods), tile('ready', t.states.ready || 0, 'ok'), tile('saturated', t.states.saturated || 0, t.states.saturated ? 'warn' : null),
      tile('unready / stale / unscraped', problems, problems ? 'bad' : null), tile('in flight', t.in_flight), tile('queued here', queued, queued ? 'warn' : null),
      tile('decisions recorded', fmt.num(sum.decisions.recorded)));
    pools.update(sum.pools);
    gpus.update(sum.gpus);
    cards.pools.note.textContent = 'click a pool to list its pods';

    pods.update(pp.pods);
    podPager.set(pp.offset, pp.limit, pp.total);
    chips.textContent = [view.pool && 'pool ' + view.pool, view.gpu && 'GPU ' + view.gpu].filter(Boolean).join(' · ');
    cards.pods.note.textContent = pp.total === pp.all ? `${pp.all} pods` : `${pp.total} of ${pp.all} pods match`;

    decisions.replaceChildren(...(dec.decisions.length ? dec.decisions.map(decisionView) : [el('p', {class: 'empty'}, 'no request routed yet')]));
    cards.decisions.note.textContent = `latest ${dec.decisions.length} of ${fmt.num(dec.recorded)} (keeps ${dec.kept})`;

    queue.update(sum.pools.map(p => p.queue).filter(Boolean));
    const m = sum.mesh;
    if (!m.enabled) {
      meshInfo.textContent = 'Not configured (peers.listen is empty): this replica routes on its own view.';
      peers.hidden = replicas.hidden = true;
    } else {
      peers.hidden = replicas.hidden = false;
      meshInfo.textContent = `this replica: ${m.id} · ${m.stats.connected} outbound streams up · ${m.stats.origins} replicas counting · ` +
        `${fmt.num(m.stats.dropped + m.stats.peer_dropped)} updates dropped · ${fmt.num(m.stats.rejected)} refused`;
      peers.update(m.peers);
      replicas.update(m.replicas);
    }
  }

  refreshNow = IG.start(refresh);
})();
