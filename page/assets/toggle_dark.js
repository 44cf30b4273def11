() => { document.body.classList.toggle('dark'); }
