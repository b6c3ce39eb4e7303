module fleetmedic.io/examples/subscriber

go 1.21
