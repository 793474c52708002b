"""One reader per trace format; ``flatcake.traces.read_trace`` picks among them."""
