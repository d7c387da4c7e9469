"""Ray itself: acquiring it (RAY_ADDRESS or a local Ray), what trials need and a cluster can hold, its terminal
noise, cluster.yaml's pins."""
