# A SyTest homeserver factory for synapse_lite, selected with `-I SynapseLite`.
# Written for synapse_lite (see contrib/sytest/README.md); put this lib
# directory on Perl's include path (PERL5LIB) when running SyTest's
# run-tests.pl.

use strict;
use warnings;

require SyTest::Homeserver::SynapseLite;

package SyTest::HomeserverFactory::SynapseLite;
use base qw( SyTest::HomeserverFactory );

use Cwd qw( abs_path );
use File::Basename qw( dirname );

# The synapse_lite checkout this plugin is part of: five directories up from
# contrib/sytest/lib/SyTest/HomeserverFactory/.
sub _own_checkout
{
   my $here = dirname( abs_path( __FILE__ ) );
   return abs_path( "$here/../../../../.." );
}

sub _init
{
   my $self = shift;

   my $checkout = $ENV{SYNAPSE_LITE_DIR} // _own_checkout();

   $self->{args} = {
      synapse_lite_dir => $checkout,
      python           => undef,
      layout           => "monolith",
      database         => "sqlite",
      print_output     => 0,
   };

   $self->SUPER::_init( @_ );
}

sub implementation_name
{
   return "synapse_lite";
}

sub get_options
{
   my $self = shift;

   return (
      'd|synapse-lite-directory=s' => \$self->{args}{synapse_lite_dir},
      'python=s'                   => \$self->{args}{python},
      'layout=s'                   => \$self->{args}{layout},
      'database=s'                 => \$self->{args}{database},
      'S|server-log+'              => \$self->{args}{print_output},
      $self->SUPER::get_options(),
   );
}

sub print_usage
{
   print STDERR <<'USAGE'
   -d, --synapse-lite-directory DIR - the synapse_lite checkout (default:
                                      $SYNAPSE_LITE_DIR, else the checkout
                                      this plugin is part of)

       --python PATH                - the Python that runs it (default:
                                      DIR/.venv/bin/python, else python3)

       --layout NAME                - monolith (default), default (the router
                                      in front of the workers) or sharded: a
                                      layout of `synapse-lite generate-config`

       --database ENGINE            - sqlite (default) or postgres (a fresh
                                      database per homeserver on
                                      127.0.0.1:5432, dropped when it stops)

   -S, --server-log                 - pass the servers' output through
USAGE
}

sub create_server
{
   my $self = shift;
   my %args = %{ $self->{args} };

   my $dir = $args{synapse_lite_dir};
   -f "$dir/synapse_lite/__init__.py" or
      die "$dir is not a synapse_lite checkout: give one with --synapse-lite-directory\n";

   if( !defined $args{python} ) {
      my $venv_python = "$dir/.venv/bin/python";
      $args{python} = -x $venv_python ? $venv_python : "python3";
   }

   return SyTest::Homeserver::SynapseLite->new( @_, %args );
}

1;
