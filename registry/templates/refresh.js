// Swap <main> for a fresh copy every few seconds; skip while the tab is hidden.
setInterval(async () => {
  if (document.hidden) return;
  try {
    const r = await fetch(location.href, {headers: {"X-Refresh": "1"}});
    if (!r.ok) return;
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    const fresh = doc.querySelector("main");
    if (fresh) document.querySelector("main").replaceWith(fresh);
  } catch (e) { /* registry restarting: keep the last view */ }
}, {{ refresh_ms }});
