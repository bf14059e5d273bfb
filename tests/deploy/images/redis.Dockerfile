# Test-only stand-in for the compose file's redis:7.2-bookworm, which cannot be pulled here:
# Debian's redis-server on the locally made base, run the way the official image runs it.
ARG BASE_IMAGE=aaren-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
# The official image's working directory: its AOF and RDB files land in the mounted volume.
WORKDIR /data
# The official image builds Redis with protected mode off (in a container it must accept the
# network's clients); Debian's keeps it on, so the same command line gets the flag here.
RUN printf '%s\n' '#!/bin/sh' \
      'if [ "$1" = redis-server ]; then shift; exec redis-server --protected-mode no "$@"; fi' \
      'exec "$@"' >/usr/local/bin/redis-entrypoint \
    && chmod +x /usr/local/bin/redis-entrypoint
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/redis-entrypoint"]
CMD ["redis-server"]
