() => { const pin = () => { const box = document.getElementById('draft-tree'); if (!box) return;
    const x = box.scrollLeft;
    box.querySelectorAll('.infolayer').forEach(g => { g.style.transform = x ? `translateX(${x}px)` : ''; });
    box.classList.toggle('scrolled-end', x + box.clientWidth >= box.scrollWidth - 2); };
  document.addEventListener('scroll', (e) => { if (e.target && e.target.id === 'draft-tree') pin(); }, true);
  setInterval(pin, 500); }
