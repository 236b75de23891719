"""One request as data: what is known of it and answered, its id, its JSON bytes."""
