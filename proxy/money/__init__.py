"""What requests cost in dollars, and who spent what."""
