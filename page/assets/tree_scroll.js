() => { const pin = () => { const box = document.getElementById('draft-tree'); if (!box) return;
    const x = box.scrollLeft, svg = box.querySelector('.main-svg'); if (!svg) return;
    const width = svg.getBoundingClientRect().width;
    box.querySelectorAll('.infolayer > g').forEach(g => {  // the title, its subtitle, the legend: each moves as far
      // as it can while it still ends inside the figure, so a long one is still read whole by scrolling
      const bb = g.getBBox(), shift = Math.max(0, Math.min(x, width - bb.x - bb.width - 8));
      g.style.transform = shift ? `translateX(${shift}px)` : ''; });
    box.classList.toggle('scrolled-end', x + box.clientWidth >= box.scrollWidth - 2); };
  document.addEventListener('scroll', (e) => { if (e.target && e.target.id === 'draft-tree') pin(); }, true);
  setInterval(pin, 500); }
