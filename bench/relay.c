/* A minimal single-threaded epoll TCP byte relay: the ceiling of any in-path
 * proxy, since it parses and records nothing. Used by bench/proxy-overhead.
 *
 *   relay LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT
 *
 * Per connection: two sockets, one 64 KiB buffer per direction; read what is
 * there, write it all, wait for EPOLLOUT on a short write and stop reading
 * that side until the buffer drains. Prints "ready" once listening. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "relay_net.h"

#define BUF 65536

struct conn;
struct side {
  struct conn *c;
  int fd;
  int up; /* 1: upstream socket */
};
struct conn {
  struct side s[2]; /* 0 client, 1 upstream */
  unsigned armed[2];
  char buf[2][BUF]; /* buf[i]: bytes read from side i, to write to side 1-i */
  int len[2], off[2];
};

static int ep;

static void arm(struct conn *c) {
  for (int i = 0; i < 2; i++) {
    struct epoll_event ev = {0};
    ev.data.ptr = &c->s[i];
    /* read side i while its buffer is empty; write side i while the other has data */
    if (c->len[i] == c->off[i]) ev.events |= EPOLLIN;
    if (c->len[1 - i] > c->off[1 - i]) ev.events |= EPOLLOUT;
    if (ev.events == c->armed[i]) continue;
    c->armed[i] = ev.events;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->s[i].fd, &ev);
  }
}

static void drop(struct conn *c) {
  close(c->s[0].fd);
  close(c->s[1].fd);
  free(c);
}

/* returns -1 when the connection is gone */
static int flush_to(struct conn *c, int from) {
  int to = 1 - from;
  while (c->off[from] < c->len[from]) {
    ssize_t w = send(c->s[to].fd, c->buf[from] + c->off[from], c->len[from] - c->off[from], MSG_NOSIGNAL);
    if (w > 0) { c->off[from] += (int)w; continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return 1;
    return -1;
  }
  c->off[from] = c->len[from] = 0;
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: relay LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  struct sockaddr_in ua;
  if (relay_upstream(argv[2], argv[3], &ua)) {
    fprintf(stderr, "relay: upstream host %s is not an IPv4 address\n", argv[2]);
    return 2;
  }
  int lfd = relay_listen(argv[1]);
  if (lfd < 0) return 1;
  ep = epoll_create1(0);
  struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
  printf("ready\n");
  fflush(stdout);
  struct epoll_event evs[256];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return 1;
    for (int i = 0; i < n; i++) {
      if (evs[i].events == 0) continue; /* its connection was dropped in this batch */
      if (evs[i].data.ptr == NULL) {
        int fds[2], r;
        while ((r = relay_accept_pair(lfd, &ua, fds)) != 0) {
          if (r < 0) continue;
          int cfd = fds[0], ufd = fds[1];
          struct conn *c = calloc(1, sizeof *c);
          c->s[0] = (struct side){c, cfd, 0};
          c->s[1] = (struct side){c, ufd, 1};
          for (int k = 0; k < 2; k++) {
            c->armed[k] = EPOLLIN;
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->s[k]};
            epoll_ctl(ep, EPOLL_CTL_ADD, c->s[k].fd, &ev);
          }
        }
        continue;
      }
      struct side *sd = evs[i].data.ptr;
      struct conn *c = sd->c;
      int me = sd->up;
      if (evs[i].events & EPOLLOUT) {
        if (flush_to(c, 1 - me) < 0) { drop(c); goto next_conn_gone; }
      }
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        if (c->len[me] == c->off[me]) {
          ssize_t r = recv(sd->fd, c->buf[me], BUF, 0);
          if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { drop(c); goto next_conn_gone; }
          if (r > 0) {
            c->len[me] = (int)r;
            c->off[me] = 0;
            if (flush_to(c, me) < 0) { drop(c); goto next_conn_gone; }
          }
        }
      }
      arm(c);
      continue;
    next_conn_gone:
      /* the other side's events in this batch point at freed memory: drop them */
      for (int j = i + 1; j < n; j++) {
        struct side *o = evs[j].data.ptr;
        if (o == &c->s[0] || o == &c->s[1]) evs[j].events = 0;
      }
      continue;
    }
  }
}
