// Tier 2's status page, on the admin listener: the clusters by region
// (health, breakers, load, cost, override, last error), the tenants' use
// of their limits and budgets (paged by the server), and this replica's
// Redis, limiter and Consul. It reads the admin API with the admin token.
'use strict';

(() => {
  const {el, card, table, fmt, bar, tile, badge} = IG;
  const API = '/admin/v1/';
  const stateClass = {ok: 'ok', degraded: 'warn', unreachable: 'bad', drained: 'muted', unknown: 'warn'};
  const breakerClass = {closed: 'ok', 'half-open': 'warn', open: 'bad'};

  const view = {filter: '', open: new Set(), after: '', cursors: []};
  let refreshNow = () => {};

  const tiles = el('div', {class: 'tiles', id: 'tiles'});

  // Clusters, one table per region, a click opens the per-model view.
  const filter = el('input', {type: 'search', id: 'cluster-filter', placeholder: 'filter: cluster, region, model, state…',
    oninput: IG.debounce(e => { view.filter = e.target.value.toLowerCase(); refreshNow(); }, 200)});
  const regions = el('div', {id: 'regions'});
  const clusterCols = [
    {label: 'cluster', cell: c => el('span', {title: c.address}, c.name)},
    {label: 'state', cell: c => badge(c.state, stateClass[c.state])},
    {label: 'ready pods', num: true, cell: c => `${c.health.ready_pods} / ${c.health.pods}`},
    {label: 'load', num: true, cell: c => el('span', {class: c.health.load_fresh ? null : 'warn'},
      c.health.load_age_seconds === null || c.health.load_age_seconds === undefined ? 'none yet' : fmt.ms(1000 * c.health.load_age_seconds) + ' old')},
    {label: 'utilisation', cell: c => bar(c.load.utilization, 0.7, 0.9)},
    {label: 'in flight', num: true, cell: c => c.load.in_flight},
    {label: 'cost', num: true, cell: c => costText(c.cost)},
    {label: 'breakers', cell: c => breakersText(c.breakers)},
    {label: 'override', cell: c => overrideText(c.override)},
    {label: 'last error', wrap: true, cell: c => c.last_error
      ? el('span', {class: 'bad', title: c.last_error.at}, `${fmt.ago(c.last_error.at)}: ${c.last_error.model ? c.last_error.model + ': ' : ''}${c.last_error.message}`)
      : el('span', {class: 'muted'}, '–')},
  ];
  function costText(k) {
    if (!k) return '–';
    const raw = k.override !== null && k.override !== undefined ? `${k.override} (override; ${k.advertised} advertised)` : `${k.advertised}`;
    return `${raw} /${k.unit}` + (k.weight !== 1 ? ` ÷ weight ${k.weight}` : '') + ` → ${Number(k.effective).toPrecision(3)}`;
  }
  function breakersText(bs) {
    if (!bs || !bs.length) return el('span', {class: 'muted'}, 'none yet');
    const notClosed = bs.filter(b => b.state !== 'closed');
    if (!notClosed.length) return badge(`${bs.length} closed`, 'ok');
    return el('span', null, notClosed.map(b => [badge(`${b.model}: ${b.state}`, breakerClass[b.state]), ' ']));
  }
  function overrideText(o) {
    if (!o) return el('span', {class: 'muted'}, '–');
    const parts = [];
    if (o.drain) parts.push('drained');
    if (o.weight !== null && o.weight !== undefined) parts.push('weight ' + o.weight);
    if (o.cost !== null && o.cost !== undefined) parts.push('cost ' + o.cost);
    return el('span', {class: o.drain ? 'warn' : null}, parts.join(', ') || '–');
  }
  function modelDetail(c) {
    const models = Object.entries(c.load.models || {}).map(([name, m]) => ({name, ...m}));
    const t = table([
      {label: 'model', cell: m => m.name + (m.base ? ` (adapter of ${m.base})` : '')},
      {label: 'pool', cell: m => m.pool},
      {label: 'ready / pods', num: true, cell: m => `${m.ready_pods} / ${m.pods}`},
      {label: 'queue', num: true, cell: m => m.queue},
      {label: 'running', num: true, cell: m => m.running},
      {label: 'in flight', num: true, cell: m => m.in_flight},
      {label: 'KV headroom', cell: m => bar(m.kv_headroom === undefined ? null : m.kv_headroom, 2, 2)},
      {label: 'saturated', cell: m => m.saturated ? badge('saturated', 'warn') : 'no'},
    ], {empty: 'no load summary yet'});
    t.update(models);
    const b = table([
      {label: 'model', cell: x => x.model},
      {label: 'breaker', cell: x => badge(x.state, breakerClass[x.state])},
      {label: 'failures in a row', num: true, cell: x => x.consecutive_failures},
      {label: 'since', cell: x => fmt.ago(x.since)},
    ], {empty: 'no breaker yet (no request routed there)'});
    b.update(c.breakers || []);
    const h = c.health;
    return el('div', null,
      el('p', null, `id ${c.id} · ${c.address} · capacity ${c.capacity || 'unknown'} · pricing ${c.pricing || '–'} · ` +
        `last poll ${fmt.ago(h.last_poll_at)}` + (h.consecutive_poll_failures ? ` · ${h.consecutive_poll_failures} polls failed in a row: ${h.last_poll_error}` : '')),
      t, b);
  }

  // Tenants: paged by the server with an "after" cursor.
  const usage = table([
    {label: 'tenant', cell: u => el('span', {title: u.name || ''}, u.tenant_id + (u.disabled ? ' (disabled)' : ''))},
    {label: 'scope', cell: u => u.scope.model || 'all models'},
    {label: 'requests / min', cell: u => valueView(u.scope.rpm)},
    {label: 'tokens / min', cell: u => valueView(u.scope.tpm)},
    {label: 'concurrent', cell: u => valueView(u.scope.concurrent)},
    {label: 'budget', cell: u => valueView(u.scope.budget, u.scope.budget_period)},
  ], {row: u => ({dataset: {tenant: u.tenant_id}}), empty: 'no tenant'});
  function valueView(v, period) {
    if (!v || !v.limit) return el('span', {class: 'muted'}, v && v.used ? fmt.num(v.used) + ' (no limit)' : '–');
    const frac = (v.used + (v.leased || 0)) / v.limit;
    return el('span', {title: `${v.used} used, ${v.leased || 0} leased, ${v.remaining} remaining` + (v.reset_seconds !== undefined ? `, resets in ${Math.ceil(v.reset_seconds)} s` : '')},
      bar(Math.min(frac, 1)), ` ${fmt.num(v.used)} / ${fmt.num(v.limit)}` + (period ? ' per ' + period : ''));
  }
  const prev = el('button', {type: 'button', onclick: () => { view.after = view.cursors.pop() || ''; refreshNow(); }}, '‹ prev');
  const next = el('button', {type: 'button'}, 'next ›');
  const usageNote = el('span', {class: 'muted'});

  // Services.
  const services = table([
    {label: 'service', cell: s => s.name},
    {label: 'state', cell: s => badge(s.state, s.cls)},
    {label: 'detail', wrap: true, cell: s => s.detail},
  ]);

  const cards = {
    clusters: card('clusters', 'Clusters by region', el('div', {class: 'controls'}, filter), regions),
    tenants: card('tenants', 'Tenants: use of limits and budgets', el('div', {class: 'controls'}, prev, usageNote, next), usage),
    services: card('services', 'Redis, limiter and Consul', services),
  };
  document.getElementById('main').append(tiles, ...Object.values(cards));

  function matches(c) {
    if (!view.filter) return true;
    return [c.name, c.region, c.state, c.address, ...(c.models || [])].some(s => String(s || '').toLowerCase().includes(view.filter));
  }

  function renderClusters(list) {
    const all = list.regions.flatMap(r => r.clusters);
    const count = s => all.filter(c => c.state === s).length;
    const open = all.reduce((n, c) => n + (c.breakers || []).filter(b => b.state !== 'closed').length, 0);
    regions.replaceChildren(...list.regions.map(r => {
      const shown = r.clusters.filter(matches);
      if (!shown.length && view.filter) return null;
      const t = table(clusterCols, {row: c => ({class: 'clickable', dataset: {cluster: c.name, state: c.state},
        title: 'show models and breakers', onclick: () => { view.open.has(c.id) ? view.open.delete(c.id) : view.open.add(c.id); refreshNow(); }}),
      empty: 'no cluster'});
      t.update(shown);
      // Opened clusters get their detail row after their own.
      for (const tr of [...t.tBodies[0].rows]) {
        const c = shown.find(x => x.name === tr.dataset.cluster);
        if (c && view.open.has(c.id)) tr.after(el('tr', {class: 'detail'}, el('td', {colspan: clusterCols.length}, modelDetail(c))));
      }
      return el('div', {dataset: {region: r.region}}, el('h3', null, r.region + (r.own ? ' (this replica\'s region)' : '')), t);
    }));
    cards.clusters.note.textContent = `${all.length} clusters · failover order: ${[list.region, ...(list.region_order || [])].join(' → ')}`;
    return {all, count, open};
  }

  async function refresh() {
    const [cl, us, st] = await Promise.allSettled([
      IG.get(API + 'clusters'),
      IG.get(API + 'usage?limit=50' + (view.after ? '&after=' + encodeURIComponent(view.after) : '')),
      IG.get(API + 'status'),
    ]);
    for (const r of [cl, us, st]) if (r.status === 'rejected' && r.reason instanceof IG.AuthError) throw r.reason;
    if (cl.status === 'rejected') throw cl.reason;

    const {all, count, open} = renderClusters(cl.value);
    const t = [tile('clusters', all.length), tile('ok', count('ok'), 'ok'), tile('degraded', count('degraded'), count('degraded') ? 'warn' : null),
      tile('unreachable', count('unreachable'), count('unreachable') ? 'bad' : null), tile('drained', count('drained')),
      tile('breakers not closed', open, open ? 'bad' : null)];

    if (us.status === 'fulfilled') {
      const rows = us.value.data.flatMap(u => (u.scopes && u.scopes.length ? u.scopes : [{}]).map(scope => ({...u, scope})));
      usage.update(rows);
      prev.disabled = !view.after;
      next.disabled = !us.value.has_more;
      next.onclick = () => { view.cursors.push(view.after); view.after = us.value.next_after; refreshNow(); };
      usageNote.textContent = `${us.value.data.length} tenants on this page`;
    } else {
      usageNote.textContent = 'usage unavailable: ' + us.reason.message;
    }

    if (st.status === 'fulfilled') {
      const s = st.value, r = s.redis, l = s.limiter, c = s.consul;
      IG.setScope(`region ${s.region} · replica ${s.replica_id} · ${s.version} · up ${fmt.ms(1000 * s.uptime_seconds)}`);
      const rows = [
        {name: 'Redis (' + r.mode + ')', state: r.mode === 'memory' ? 'in memory' : r.reachable ? 'reachable' : 'unreachable',
          cls: r.mode === 'memory' ? 'muted' : r.reachable ? 'ok' : 'bad',
          detail: r.reachable ? `PING ${r.latency_ms} ms` : (r.error || (r.mode === 'memory' ? 'no Redis configured: limits are this replica\'s own' : ''))},
        {name: 'limiter', state: l.redis_down ? (l.fail_closed ? 'refusing (fail closed)' : 'local limits (fail open)') : 'ok',
          cls: l.redis_down ? 'bad' : 'ok',
          detail: `${fmt.num(l.admissions)} admissions, ${fmt.num(l.degraded_admissions)} degraded, ${fmt.num(l.redis_errors)} Redis errors · limits.replicas ${l.replicas}`},
        {name: 'Consul (' + c.mode + ')', state: c.mode === 'static' ? 'static list' : c.reachable ? 'reachable' : 'unreachable',
          cls: c.mode === 'static' ? 'muted' : c.reachable ? 'ok' : 'bad',
          detail: (c.address ? c.address + ' · ' : '') + `${c.clusters_found} clusters` +
            (c.last_success_at ? ` · last answer ${fmt.ago(c.last_success_at)}` : '') + (c.last_error ? ` · ${c.last_error}` : '')},
      ];
      services.update(rows);
      t.push(tile('Redis', rows[0].state, rows[0].cls), tile('Consul', rows[2].state, rows[2].cls));
    } else {
      services.update([{name: 'status', state: 'unavailable', cls: 'warn', detail: st.reason.message}]);
    }
    tiles.replaceChildren(...t);
  }

  refreshNow = IG.start(refresh);
})();
