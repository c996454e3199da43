"""Every report people read: plots (memory timeline, memory by kind, update scheme, schedule
maps, energy against budget) and the HTML page that holds them."""
