"""What-if replay: a fault history replayed on a modelled cluster under each policy, and the time each loses."""
