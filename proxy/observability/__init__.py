"""What the proxy tells operators: metrics, logs, traces and state gauges."""
