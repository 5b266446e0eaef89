/* Shared by bench/relay.c and bench/delay_relay.c: the listening socket and
 * a client's pair of sockets (the accepted one and one connected to the
 * upstream), both non-blocking with TCP_NODELAY. */
#ifndef TIERLAB_BENCH_RELAY_NET_H
#define TIERLAB_BENCH_RELAY_NET_H
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* A non-blocking socket listening on 127.0.0.1:PORT, or -1 (after perror). */
static int relay_listen(const char *port) {
  struct sockaddr_in la = {0};
  la.sin_family = AF_INET;
  la.sin_port = htons((unsigned short)atoi(port));
  la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&la, sizeof la) || listen(fd, 1024)) {
    perror("relay: bind/listen");
    return -1;
  }
  return fd;
}

/* The upstream HOST:PORT (IPv4); 0, or -1 when HOST is not an address. */
static int relay_upstream(const char *host, const char *port, struct sockaddr_in *ua) {
  *ua = (struct sockaddr_in){0};
  ua->sin_family = AF_INET;
  ua->sin_port = htons((unsigned short)atoi(port));
  return inet_pton(AF_INET, host, &ua->sin_addr) == 1 ? 0 : -1;
}

/* The next client waiting on LFD and a socket connected to UA for it, in
 * fds[0] and fds[1]: 1; 0 when no client waits; -1 when the upstream refused
 * (the client is closed). The connect blocks: it is only on the connection
 * path, which the benchmarks do not time. */
static int relay_accept_pair(int lfd, const struct sockaddr_in *ua, int fds[2]) {
  int cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
  if (cfd < 0) return 0;
  int ufd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(ufd, (const struct sockaddr *)ua, sizeof *ua)) {
    close(cfd);
    close(ufd);
    return -1;
  }
  int one = 1;
  setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(ufd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(ufd, F_SETFL, fcntl(ufd, F_GETFL) | O_NONBLOCK);
  fds[0] = cfd;
  fds[1] = ufd;
  return 1;
}
#endif
