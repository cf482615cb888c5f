# One synapse_lite homeserver started by SyTest: its config written from what
# SyTest asks for, `synapse-lite run` (the launcher: every process of the
# layout), health awaited, stopped at the end. Written for synapse_lite (see
# contrib/sytest/README.md); it runs inside SyTest's run-tests.pl.

use strict;
use warnings;

package SyTest::Homeserver::SynapseLite;
use base qw( SyTest::Homeserver );

use Carp;
use Cwd qw( getcwd );
use Future::Utils qw( repeat );
use IO::Handle;
use Net::Async::HTTP;

use SyTest::SSL qw( ensure_ssl_key create_ssl_cert );

# Ports handed to `synapse-lite generate-config` as one block counted up from
# its first (the layout's client port, replication, each process, the
# router's metrics): the largest layout, sharded, uses 11.
use constant LAYOUT_PORTS => 12;

# How long the launcher may take until the whole layout answers /health (it
# starts the processes tier by tier; the router, when there is one, last).
# SyTest's own limit on starting a homeserver, 60 s times TIMEOUT_FACTOR,
# usually comes first.
use constant START_SECONDS => 120;

sub _init
{
   my $self = shift;
   my ( $args ) = @_;

   $self->{$_} = delete $args->{$_} for qw(
      synapse_lite_dir python layout database print_output
   );

   # SyTest names it with abs_path, which is undef when the work directory
   # does not exist: nothing would then say where files go.
   defined $args->{hs_dir} or
      croak "No homeserver directory: does SyTest's --work-directory exist?";

   $self->SUPER::_init( $args );

   my $idx = $self->{hs_index};

   # What SyTest talks to, over HTTPS with a certificate of its CA: the
   # federation API (the port is part of the server name) and the client
   # API (the same port on the monolith; the router's on layouts with one).
   $self->{ports}{federation} = main::alloc_port( "synapse_lite[$idx].federation" );
   $self->{ports}{client} = $self->{layout} eq "monolith"
      ? $self->{ports}{federation}
      : main::alloc_port( "synapse_lite[$idx].client" );

   my @block = map { main::alloc_port( "synapse_lite[$idx].layout" ) } 1 .. LAYOUT_PORTS;
   $block[-1] == $block[0] + LAYOUT_PORTS - 1 or
      croak "SyTest allocated non-consecutive ports @block";
   $self->{ports}{layout} = $block[0];
}

sub server_name
{
   my $self = shift;
   return "$self->{bind_host}:$self->{ports}{federation}";
}

sub federation_host
{
   my $self = shift;
   return $self->{bind_host};
}

sub federation_port
{
   my $self = shift;
   return $self->{ports}{federation};
}

sub public_baseurl
{
   my $self = shift;
   return "https://$self->{bind_host}:$self->{ports}{client}";
}

sub start
{
   my $self = shift;

   my $hs_dir = $self->{hs_dir};
   my $output = $self->{output};

   # SyTest's CA signs a certificate for the host it connects to; its keys/
   # is in the working directory (SyTest's checkout).
   my $cert = "$hs_dir/tls.crt";
   my $key = "$hs_dir/tls.key";
   ensure_ssl_key( $key );
   create_ssl_cert( $cert, $key, $self->{bind_host} );

   my @command = (
      $self->{python}, "-m", "bench.sytest_homeserver", "write-config",
      "--directory",       $hs_dir,
      "--layout",          $self->{layout},
      "--database",        $self->{database},
      "--server-name",     $self->server_name,
      "--base-port",       $self->{ports}{layout},
      "--port-count",      LAYOUT_PORTS,
      "--federation-port", $self->{ports}{federation},
      "--client-port",     $self->{ports}{client},
      "--tls-certificate", $cert,
      "--tls-key",         $key,
      "--sytest-dir",      getcwd(),
      map { ( "--app-service-file", $_ ) } @{ $self->{app_service_config_files} // [] },
   );

   $output->diag( "Writing the config of synapse_lite $self->{hs_index} ($self->{layout}, $self->{database})" );

   return $self->_run_command(
      setup   => $self->_python_setup,
      command => \@command,
   )->then( sub {
      $self->{config_written} = 1;
      $self->_start_launcher;
   });
}

# Where the Python commands run: in the checkout, which is on PYTHONPATH (for
# bench.sytest_homeserver; synapse_lite itself may be installed elsewhere).
sub _python_setup
{
   my $self = shift;
   my $dir = $self->{synapse_lite_dir};

   return [
      chdir => $dir,
      env   => {
         %ENV,
         PYTHONPATH => join( ":", $dir, grep { defined and length } $ENV{PYTHONPATH} ),
      },
   ];
}

sub _start_launcher
{
   my $self = shift;

   my $hs_dir = $self->{hs_dir};
   my $idx = $self->{hs_index};
   my $output = $self->{output};

   open $self->{log_fh}, ">>", "$hs_dir/server.log" or
      die "Cannot open $hs_dir/server.log for writing - $!";
   $self->{log_fh}->autoflush( 1 );

   my $proc = $self->_start_process(
      setup   => $self->_python_setup,
      command => [
         $self->{python}, "-m", "synapse_lite.app.cli", "run", "-c", "$hs_dir/homeserver.yaml",
      ],
      name    => "synapse_lite-$idx",
   );
   my $proc_info = $self->{proc_info}{$proc};
   $proc_info->print_output = 1 if $self->{print_output};

   $output->diag( "Started synapse-lite run (pid ${\ $proc->pid }); its output is in $hs_dir/server.log" );

   return Future->wait_any(
      $self->_await_healthy->then( sub {
         $self->await_connectable( $self->{bind_host}, $self->{ports}{client} );
      }),
      $proc_info->finished_future->without_cancel->then_fail(
         "synapse-lite run exited before serving: see $hs_dir/server.log",
      ),
   );
}

# The launcher's own output and that of every process, merged, one line at
# a time: kept in server.log (SyTest keeps only the last lines).
sub _on_output_line
{
   my $self = shift;
   my ( $proc_info, $line ) = @_;

   print { $self->{log_fh} } "$line\n" if $self->{log_fh};
   $self->SUPER::_on_output_line( $proc_info, $line );
}

# /health on the layout's first port: the monolith's main process, or the
# router, which the launcher starts once every other process is healthy.
sub _await_healthy
{
   my $self = shift;

   my $url = "http://127.0.0.1:$self->{ports}{layout}/health";
   my $http = Net::Async::HTTP->new( timeout => 5, max_connections_per_host => 1 );
   $self->add_child( $http );

   my $deadline = time + START_SECONDS;

   return ( repeat {
      return Future->fail( "$url did not answer 200 within ${\ START_SECONDS } s" )
         if time > $deadline;

      main::delay( 0.25 )->then( sub {
         $http->GET( $url );
      })->then(
         sub { Future->done( $_[0]->code == 200 ) },
         sub { Future->done( 0 ) },
      );
   } while => sub { !$_[0]->failure and !$_[0]->get } )->on_ready( sub {
      $self->remove_child( $http );
   })->on_done( sub {
      $self->{output}->diag( "synapse_lite $self->{hs_index} is healthy" );
   });
}

# Stop the launcher (SIGINT: it stops every process of the layout, the last
# started first), then drop the homeserver's PostgreSQL database.
sub kill_and_await_finish
{
   my $self = shift;

   return $self->SUPER::kill_and_await_finish->then( sub {
      close $self->{log_fh} if $self->{log_fh};
      undef $self->{log_fh};
      return Future->done unless $self->{config_written} and $self->{database} eq "postgres";

      $self->_run_command(
         setup   => $self->_python_setup,
         command => [
            $self->{python}, "-m", "bench.sytest_homeserver", "drop-database",
            "--directory", $self->{hs_dir},
         ],
      )->else( sub {
         warn "Could not drop the database of synapse_lite $self->{hs_index}: $_[0]";
         Future->done;
      });
   });
}

1;
